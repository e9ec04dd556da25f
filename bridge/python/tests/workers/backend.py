"""torch.distributed on the "gocoll" backend: every collective against a
reference computed locally, new_group, Work semantics, DDP on gocoll vs DDP
on gloo, bf16 DDP, refused inputs and a size mismatch surfacing as
exceptions (in DDP too). Run under torchrun (env://) or tests/launch.py
with ``--init tcp`` (init_method="tcp://…")."""

import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import expect_raises, main, report  # noqa: E402

import gocoll  # noqa: E402
import gocoll.torch  # noqa: E402,F401  (registers the backend)

R = dist.ReduceOp


def val(rank, shape, dtype=torch.float32, salt=0):
    """Deterministic per-rank data that every rank can recompute."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return (torch.randint(-8, 9, shape, generator=g)).to(dtype)


def eq(a, b, what):
    if not torch.equal(a, b):
        raise AssertionError("%s: got %s, want %s" % (what, a, b))


def collectives(r, n, checked):
    def ok(name):
        checked.append(name)

    # all_reduce, every op, sync and async (+ get_future)
    for opname in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
        dtype = torch.float64 if opname in ("PRODUCT", "AVG") else torch.int64
        xs = [val(i, (7,), dtype, salt=1) for i in range(n)]
        stack = torch.stack(xs)
        want = {"SUM": lambda: stack.sum(0), "PRODUCT": lambda: stack.prod(0),
                "MIN": lambda: stack.min(0).values, "MAX": lambda: stack.max(0).values,
                "AVG": lambda: stack.mean(0)}[opname]()
        t = xs[r].clone()
        dist.all_reduce(t, op=getattr(R, opname))
        if opname == "AVG":
            assert torch.allclose(t, want), (t, want)
        else:
            eq(t, want, "all_reduce " + opname)
        ok("all_reduce " + opname)
    t = val(r, (1000,), torch.float32, 2)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    got = fut.wait()
    assert w.is_completed() and w.is_success() and w.exception() is None
    eq(got[0], sum(val(i, (1000,), torch.float32, 2) for i in range(n)), "all_reduce async")
    assert got[0] is t or got[0].data_ptr() == t.data_ptr()
    ok("all_reduce async/get_future")
    # bfloat16 and a non-contiguous tensor
    t = val(r, (3, 4), torch.bfloat16, 3)
    dist.all_reduce(t)
    eq(t, sum(val(i, (3, 4), torch.float32, 3) for i in range(n)).to(torch.bfloat16), "bf16")
    base = val(r, (4, 6), torch.float32, 4)
    t = base.t()
    dist.all_reduce(t)
    eq(t, sum(val(i, (4, 6), torch.float32, 4) for i in range(n)).t(), "non-contiguous")
    ok("all_reduce bf16/non-contiguous")

    root = n - 1
    t = val(r, (5,), salt=5)
    dist.broadcast(t, src=root)
    eq(t, val(root, (5,), salt=5), "broadcast")
    ok("broadcast")

    dst = 1 % n
    t = val(r, (6,), salt=6)
    dist.reduce(t, dst=dst, op=R.MAX)
    if r == dst:
        eq(t, torch.stack([val(i, (6,), salt=6) for i in range(n)]).max(0).values, "reduce")
    ok("reduce")

    outs = [torch.empty(2, 3) for _ in range(n)]
    dist.all_gather(outs, val(r, (2, 3), salt=7))
    for i in range(n):
        eq(outs[i], val(i, (2, 3), salt=7), "all_gather")
    ok("all_gather")
    out = torch.empty(n * 2, 3)
    dist.all_gather_into_tensor(out, val(r, (2, 3), salt=8))
    eq(out, torch.cat([val(i, (2, 3), salt=8) for i in range(n)]), "all_gather_into_tensor")
    ok("all_gather_into_tensor")

    ins = [val(r, (4,), salt=9 + j) for j in range(n)]
    out = torch.empty(4)
    dist.reduce_scatter(out, ins)
    eq(out, sum(val(i, (4,), salt=9 + r) for i in range(n)), "reduce_scatter")
    ok("reduce_scatter")
    inp = val(r, (n * 3,), salt=30)
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, inp, op=R.MIN)
    want = torch.stack([val(i, (n * 3,), salt=30) for i in range(n)]).min(0).values[r * 3:r * 3 + 3]
    eq(out, want, "reduce_scatter_tensor")
    ok("reduce_scatter_tensor")

    # all_to_all_single, equal and with uneven row splits (s(i,j) rows i -> j)
    inp = val(r, (n * 2, 3), salt=31)
    out = torch.empty(n * 2, 3)
    dist.all_to_all_single(out, inp)
    eq(out, torch.cat([val(i, (n * 2, 3), salt=31)[2 * r:2 * r + 2] for i in range(n)]), "a2a")

    def s(i, j):
        return (i + 2 * j) % 3

    def rows_of(i):
        return val(i, (sum(s(i, j) for j in range(n)), 2), salt=32)

    inp = rows_of(r)
    out = torch.empty(sum(s(i, r) for i in range(n)), 2)
    dist.all_to_all_single(out, inp, [s(i, r) for i in range(n)], [s(r, j) for j in range(n)])
    want = torch.cat([rows_of(i)[sum(s(i, j) for j in range(r)):][:s(i, r)] for i in range(n)])
    eq(out, want, "a2a splits")
    ok("all_to_all_single")
    # gocoll.Comm's torch-named alias, same splits
    comm = dist.distributed_c10d._get_default_group().comm
    out2 = torch.empty_like(out)
    comm.all_to_all_single(out2, inp, [s(i, r) for i in range(n)], [s(r, j) for j in range(n)])
    eq(out2, want, "Comm.all_to_all_single")

    ins = [val(r, (r + j + 1,), salt=33) for j in range(n)]
    outs = [torch.empty(i + r + 1) for i in range(n)]
    dist.all_to_all(outs, ins)
    for i in range(n):
        eq(outs[i], val(i, (i + r + 1,), salt=33), "all_to_all")
    ok("all_to_all")

    g = [torch.empty(3) for _ in range(n)] if r == root else None
    dist.gather(val(r, (3,), salt=34), g, dst=root)
    if r == root:
        for i in range(n):
            eq(g[i], val(i, (3,), salt=34), "gather")
    ok("gather")
    t = torch.empty(3)
    dist.scatter(t, [val(j, (3,), salt=35) for j in range(n)] if r == 0 else None, src=0)
    eq(t, val(r, (3,), salt=35), "scatter")
    ok("scatter")

    # point to point: a ring with isend/irecv, then blocking pairs
    nxt, prv = (r + 1) % n, (r - 1) % n
    t = torch.empty(4)
    ws = [dist.isend(val(r, (4,), salt=36), nxt), dist.irecv(t, prv)]
    for w in ws:
        w.wait()
    eq(t, val(prv, (4,), salt=36), "isend/irecv")
    if r < 2:
        t = torch.empty(2)
        if r == 0:
            dist.send(val(0, (2,), salt=37), 1)
            dist.recv(t, 1)
            eq(t, val(1, (2,), salt=37), "send/recv")
        else:
            dist.recv(t, 0)
            dist.send(val(1, (2,), salt=37), 0)
            eq(t, val(0, (2,), salt=37), "send/recv")
    ok("send/recv/isend/irecv")

    # Work.wait(timeout) is honoured: rank 1 sends only once rank 0's wait
    # timed out (rank 0 tells it through the store), then the work completes.
    store = dist.distributed_c10d._get_default_store()
    if r == 0:
        t = torch.empty(2)
        w = dist.irecv(t, 1)
        e = expect_raises(TimeoutError, w.wait, datetime.timedelta(milliseconds=200))
        assert "did not finish within" in str(e) and not w.is_completed(), e
        store.set("test/late-send", "go")
        w.wait()
        eq(t, val(1, (2,), salt=38), "late recv")
    elif r == 1:
        store.wait(["test/late-send"])
        dist.send(val(1, (2,), salt=38), 0)
    ok("Work.wait(timeout)")

    dist.barrier()
    ok("barrier")

    # new_group: a group without rank 0, and a group of two
    members = list(range(1, n))
    sub = dist.new_group(members)
    pair = dist.new_group([0, n - 1])
    if r in members:
        t = val(r, (3,), salt=39)
        dist.all_reduce(t, group=sub)
        eq(t, sum(val(i, (3,), salt=39) for i in members), "new_group all_reduce")
        t = val(r, (3,), salt=40)
        dist.broadcast(t, src=n - 1, group=sub)  # global rank, translated by torch
        eq(t, val(n - 1, (3,), salt=40), "new_group broadcast")
    else:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER
    if r in (0, n - 1):
        t = val(r, (3,), salt=41)
        dist.all_reduce(t, group=pair)
        eq(t, val(0, (3,), salt=41) + val(n - 1, (3,), salt=41), "pair")
    ok("new_group")


def refused(r, n, checked):
    t = torch.ones(3)
    msgs = {}
    msgs["dtype"] = str(expect_raises(TypeError, dist.all_reduce,
                                      torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)))
    msgs["sparse"] = str(expect_raises(ValueError, dist.all_reduce, torch.ones(3).to_sparse()))
    msgs["meta"] = str(expect_raises(ValueError, dist.all_reduce, torch.ones(3, device="meta")))
    msgs["band"] = str(expect_raises(ValueError, dist.all_reduce, torch.ones(3), op=R.BAND))
    e = expect_raises(ValueError, dist.isend, t, (r + 1) % n, tag=-3)
    msgs["tag"] = str(e)
    # the all-to-alls count and check in gocoll's one implementation
    # (gocoll._alltoall), shared by Comm and the backend
    msgs["a2a rows"] = str(expect_raises(ValueError, dist.all_to_all_single, torch.empty(n + 1, 2),
                                         torch.empty(n + 1, 2)))
    # (dist.all_to_all checks dtypes itself: the group's method, as C++ callers reach it)
    pg = dist.distributed_c10d._get_default_group()
    msgs["a2a dtype"] = str(expect_raises(ValueError, pg.alltoall, [torch.empty(1)] * n,
                                          [torch.ones(1, dtype=torch.int64)] * n))
    msgs["gather sizes"] = str(expect_raises(ValueError, pg.allgather, [[torch.empty(2)] * n],
                                             [torch.empty(3)]))
    msgs["scatter sizes"] = str(expect_raises(ValueError, pg.reduce_scatter, [torch.empty(3)],
                                              [[torch.empty(2)] * n]))
    # torch's backends raise RuntimeError: gocoll's errors through the
    # backend are that too (and keep gocoll's classes).
    assert isinstance(e, RuntimeError) and isinstance(e, gocoll.InvalidArgument), type(e).__mro__
    e = expect_raises(TypeError, dist.all_reduce, torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8))
    assert isinstance(e, RuntimeError), type(e).__mro__
    before = pg._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1))
    assert pg._get_sequence_number_for_group() == before + 1
    assert "qint8" in msgs["dtype"] and "rank %d" % r in msgs["dtype"], msgs["dtype"]
    assert "bitwise" in msgs["band"] and "rank %d" % r in msgs["band"], msgs["band"]
    assert "sparse" in msgs["sparse"] and "meta" in msgs["meta"], msgs
    assert "tag -3" in msgs["tag"], msgs["tag"]
    assert "not divisible" in msgs["a2a rows"] and "rank %d" % r in msgs["a2a rows"], msgs
    assert "dtype" in msgs["a2a dtype"] and "all_to_all" in msgs["a2a dtype"], msgs
    assert "has 2 elements, want 3" in msgs["gather sizes"], msgs
    assert "has 2 elements, want 3" in msgs["scatter sizes"], msgs
    checked.append("refused inputs")
    return msgs


def tags(r, n, checked):
    """Tagged isend/irecv: every rank sends its successor three messages of
    different sizes with tags 3, 1, 2 and receives its predecessor's in the
    order 2, 3, 1. Then a receive completes while an earlier one (another
    tag) still waits: rank 1 sends tag 22 first and tag 21 only once rank 0
    got tag 22 (through the store), so waiting in issue order would hang."""
    nxt, prv = (r + 1) % n, (r - 1) % n
    sizes = {3: 5, 1: 7, 2: 1}
    sends = [dist.isend(val(r, (sizes[t],), salt=50 + t), nxt, tag=t) for t in (3, 1, 2)]
    got = {t: torch.empty(sizes[t]) for t in (2, 3, 1)}
    recvs = [dist.irecv(got[t], prv, tag=t) for t in (2, 3, 1)]
    for w in recvs + sends:
        w.wait()
    for t, x in got.items():
        eq(x, val(prv, (sizes[t],), salt=50 + t), "recv tag %d" % t)
    checked.append("tags out of order")
    store = dist.distributed_c10d._get_default_store()
    if r == 0:
        a, b = torch.empty(2), torch.empty(3)
        wa, wb = dist.irecv(a, 1, tag=21), dist.irecv(b, 1, tag=22)
        wb.wait(datetime.timedelta(seconds=60))
        assert wb.is_completed() and not wa.is_completed()
        store.set("test/tag21", "go")
        wa.wait()
        eq(b, val(1, (3,), salt=22), "tag 22")
        eq(a, val(1, (2,), salt=21), "tag 21")
    elif r == 1:
        dist.send(val(1, (3,), salt=22), 0, tag=22)
        store.wait(["test/tag21"])
        dist.send(val(1, (2,), salt=21), 0, tag=21)
    checked.append("tagged recv not behind another tag")


def any_source(r, n, checked):
    """dist.recv without src (returns the sender) and dist.irecv without
    src (Work._source_rank()), every other rank sending at once; then in a
    group without rank 0, where torch maps the group rank back to the
    global one."""
    def round_(members, group):
        for root in members:
            if r == root:
                seen = []
                for i in range(2 * (len(members) - 1)):
                    t = torch.empty(5)
                    if i % 2 == 0:
                        src = dist.recv(t, group=group)
                    else:
                        w = dist.irecv(t, group=group)
                        w.wait()
                        src = w._source_rank()
                        if group is not None:
                            src = members[src]  # irecv's Work gives the group rank
                    eq(t, torch.full((5,), float(src)), "recv from any source")
                    seen.append(src)
                assert sorted(seen) == sorted([q for q in members if q != root] * 2), seen
            elif r in members:
                for _ in range(2):
                    dist.send(torch.full((5,), float(r)), root, group=group)
            if r in members:
                dist.barrier(group=group)
    round_(list(range(n)), None)
    members = list(range(1, n))
    sub = dist.new_group(members)
    if len(members) > 1:
        round_(members, sub)
    checked.append("recv from any source")


def coalesced(r, n, checked):
    """all_gather_coalesced (one tensor dtype, as torch requires; sizes
    differ, one empty) against all_gather per tensor, and the backend's
    allgather_coalesced with mixed dtypes."""
    shapes = [(3, 4), (0,), (5,), (2, 1, 3)]
    ins = [val(r, s, torch.float64, salt=60 + j) for j, s in enumerate(shapes)]
    outs = [[torch.full(s, -1.0, dtype=torch.float64) for s in shapes] for _ in range(n)]
    dist.all_gather_coalesced(outs, ins)
    for j, s in enumerate(shapes):
        for q in range(n):
            eq(outs[q][j], val(q, s, torch.float64, salt=60 + j), "all_gather_coalesced %d/%d" % (q, j))
    pg = dist.distributed_c10d._get_default_group()
    mixed = [val(r, (4,), torch.int8, 70), torch.empty(0), val(r, (2, 3), torch.bfloat16, 71)]
    mouts = [[torch.zeros_like(x) for x in mixed] for _ in range(n)]
    pg.allgather_coalesced(mouts, mixed).wait()
    for q in range(n):
        eq(mouts[q][0], val(q, (4,), torch.int8, 70), "mixed int8")
        eq(mouts[q][2], val(q, (2, 3), torch.bfloat16, 71), "mixed bf16")
    checked.append("all_gather_coalesced")


def monitored(r, n, checked, out):
    """gocoll.torch.monitored_barrier on gocoll groups: everyone arrives;
    the odd ranks do not arrive (rank 0 names all of them with
    wait_all_ranks, the first without), and the ranks that did arrive fail
    at once with rank 0's abort."""
    second = datetime.timedelta(seconds=1)
    gocoll.torch.monitored_barrier(dist.new_group(), datetime.timedelta(seconds=60))
    missing = [q for q in range(n) if q % 2]
    for wait_all in (True, False):
        g = dist.new_group()
        if r == 0:
            e = expect_raises(gocoll.Timeout, gocoll.torch.monitored_barrier, g, second, wait_all)
            named = missing if wait_all else missing[:1]
            who = ("rank %d" % named[0]) if len(named) == 1 else \
                "ranks %s" % ", ".join(str(q) for q in named)
            assert "%s did not arrive within" % who in str(e), (who, e)
            out["monitored_barrier" + ("_all" if wait_all else "")] = str(e)
        elif r not in missing:
            expect_raises(gocoll.RemoteError, gocoll.torch.monitored_barrier, g,
                          datetime.timedelta(seconds=60), wait_all)
    dist.barrier()  # the default group is untouched
    checked.append("monitored_barrier")


def make_model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4)).to(dtype)


def train(group, r, steps, dtype=torch.float32):
    model = make_model(dtype)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                    bucket_cap_mb=0.001)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + r)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g).to(dtype)
        y = torch.randn(8, 4, generator=g).to(dtype)
        opt.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()  # (mse_loss has no bf16 kernel on CPU)
        opt.step()
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]), ddp


def ddp(r, n, checked, out):
    gloo = dist.new_group(backend="gloo")
    w_gocoll, _ = train(None, r, 5)
    w_gloo, _ = train(gloo, r, 5)
    rel = ((w_gocoll - w_gloo).abs().max() / w_gloo.abs().max()).item()
    out["ddp_gocoll_vs_gloo"] = rel
    assert rel <= 1e-5, rel
    checked.append("DDP gocoll vs gloo")
    w_bf16, _ = train(None, r, 5, torch.bfloat16)
    every = [torch.empty_like(w_bf16) for _ in range(n)]
    dist.all_gather(every, w_bf16)
    assert all(torch.equal(every[0], x) for x in every), "bf16 weights differ across ranks"
    out["bf16_vs_fp32"] = ((w_bf16 - w_gocoll).abs().max() / w_gocoll.abs().max()).item()
    assert out["bf16_vs_fp32"] < 0.1, out["bf16_vs_fp32"]
    checked.append("DDP bf16")


def mismatch(r, n, checked, out):
    """Different sizes on different ranks: every rank gets gocoll's error as
    an exception; DDP on the failed communicator then raises it too."""
    # First on a group of its own, failing while DDP's bucket allreduce is in
    # flight: rank 0 slips in an extra all_reduce of another size, so the
    # error reaches the other ranks' DDP through the Work's future.
    fresh = dist.new_group()
    _, model = train(fresh, r, 2)  # (iteration 2 rebuilds buckets: a broadcast in forward)
    extra = dist.all_reduce(torch.ones(3), group=fresh, async_op=True) if r == 0 else None
    e = expect_raises(RuntimeError, lambda: model(torch.randn(8, 16)).sum().backward())
    out["ddp_async_error"] = str(e)
    assert "gocoll" in str(e) and "mismatched" in str(e), e
    if extra is not None:
        expect_raises(gocoll.Error, extra.wait)
    # then a blocking mismatch on the default group
    _, model = train(None, r, 2)
    t = torch.ones(4 if r == 0 else 5)
    e = expect_raises(gocoll.Error, dist.all_reduce, t)
    out["mismatch"] = str(e)
    assert "all_reduce" in str(e) and "rank %d" % r in str(e), e
    x = torch.randn(8, 16)
    e = expect_raises(RuntimeError, lambda: model(x).sum().backward())
    out["ddp_error"] = str(e)
    assert "gocoll" in str(e), e
    checked.append("mismatch error (collective and DDP)")


def run():
    args = sys.argv[1:]
    if "--init" in args and args[args.index("--init") + 1] == "tcp":
        addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        dist.init_process_group("gocoll", init_method="tcp://%s:%s" % (addr, port),
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gocoll")
    r, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "gocoll", dist.get_backend()
    checked, out = [], {}
    collectives(r, n, checked)
    out["refused"] = refused(r, n, checked)
    tags(r, n, checked)
    any_source(r, n, checked)
    coalesced(r, n, checked)
    monitored(r, n, checked, out)
    ddp(r, n, checked, out)
    mismatch(r, n, checked, out)
    out["checked"] = checked
    report(out)
    print("BACKEND OK rank %d of %d" % (r, n), flush=True)


if __name__ == "__main__":
    main(run)
