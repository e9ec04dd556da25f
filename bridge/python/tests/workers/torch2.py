"""What torch 2.x users run on CPUs, on the "gocoll" backend and on gloo in
the same job, each giving the same numbers: DDP with its comm hooks, FSDP
(FullyShardedDataParallel), functional collectives, 1-D and 2-D
DeviceMeshes (with DTensor), torch.distributed.checkpoint, and the 2.x
group API (names, batch_isend_irecv, the coalescing manager, new_group,
split_group, destroy). 4 ranks (the 2-D mesh is 2 x 2); run by
tests/test_torch2.py through tests/launch.py, env:// with USE_LIBUV=0
(Debian 13's torch has no libuv).

Prints ``RESULT {...}``: the sections that ran (``checked``) and, per
comparison, the largest difference from gloo."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import expect_raises, main, report  # noqa: E402

import gocoll.torch as gt  # noqa: E402

torch.set_num_threads(1)  # the same sums on both backends' runs


def val(rank, shape, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-8, 9, shape, generator=g).to(dtype)


def same(a, b, what):
    """Exact equality: gloo and gocoll sum small integers exactly."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if not torch.equal(a, b):
        raise AssertionError("%s: gocoll %s, gloo %s" % (what, a, b))


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train(wrapped, params, r, steps=4, lr=0.05):
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(100 + r)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        opt.step()


def flat(m):
    return torch.cat([p.detach().reshape(-1).clone() for p in m.parameters()])


def ddp(r, n, pg, gloo, out):
    """DDP with no hook and with torch's CPU comm hooks, gocoll vs gloo;
    gocoll's own allreduce_hook (state: the group) vs gloo's plain DDP."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    def run(group, hook=None, state=None, bucket_cap_mb=0.001, **kw):  # (small: several buckets)
        m = model()
        d = torch.nn.parallel.DistributedDataParallel(m, process_group=group,
                                                      bucket_cap_mb=bucket_cap_mb, **kw)
        if hook is not None:
            d.register_comm_hook(state(group) if state else group, hook)
        train(d, d.parameters(), r)
        return flat(m)

    def powersgd(group):
        return ps.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                start_powerSGD_iter=2, use_error_feedback=True, warm_start=True,
                                random_seed=0)

    # (fp16: the two backends add the halves in different orders, each
    # rounding to fp16, so they agree to fp16's precision, not float32's.
    # PowerSGD in one bucket: its callbacks issue allreduces while backward
    # issues the next bucket's, in an order that can differ between ranks.)
    cases = {
        "none": ({}, 1e-5), "static_graph": ({"static_graph": True}, 1e-5),
        "gradient_as_bucket_view": ({"gradient_as_bucket_view": True}, 1e-5),
        "allreduce_hook": ({"hook": dh.allreduce_hook}, 1e-5),
        "fp16_compress_hook": ({"hook": dh.fp16_compress_hook}, 1e-3),
        "powerSGD_hook": ({"hook": ps.powerSGD_hook, "state": powersgd, "bucket_cap_mb": 25}, 1e-5),
    }
    for name, (kw, tol) in cases.items():
        out["ddp " + name] = rel(run(pg, **kw), run(gloo, **kw))
        assert out["ddp " + name] <= tol, (name, out["ddp " + name])
    def no_sync(group):  # two micro-batches per step, the first without communication
        m = model()
        d = torch.nn.parallel.DistributedDataParallel(m, process_group=group, bucket_cap_mb=0.001)
        opt = torch.optim.SGD(d.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(200 + r)
        for _ in range(3):
            opt.zero_grad()
            with d.no_sync():
                d(torch.randn(8, 16, generator=g)).sum().backward()
            d(torch.randn(8, 16, generator=g)).sum().backward()
            opt.step()
        return flat(m)
    out["ddp no_sync"] = rel(no_sync(pg), no_sync(gloo))
    assert out["ddp no_sync"] <= 1e-5, out
    out["ddp gocoll allreduce_hook"] = rel(run(pg, gt.allreduce_hook), run(gloo))
    assert out["ddp gocoll allreduce_hook"] <= 1e-5, out
    # the bf16 hook is CUDA-only in torch 2.6 (it refuses gloo alike)
    expect_raises(TypeError, run, pg, dh.bf16_compress_hook, contains="CUDA")


def fsdp(r, n, pg, gloo, out):
    """FullyShardedDataParallel on CPU: each sharding strategy on gocoll
    and on gloo from the same weights and data; the full state dict after
    training agrees."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    def run(group, strategy):
        f = FSDP(model(), process_group=group, device_id=torch.device("cpu"),
                 sharding_strategy=strategy, use_orig_params=True)
        train(f, f.parameters(), r)
        sd = get_model_state_dict(f, options=StateDictOptions(full_state_dict=True))
        return torch.cat([sd[k].reshape(-1) for k in sorted(sd)])

    # (NO_SHARD is deprecated in 2.6 in favour of DDP, tested above)
    for s in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP):
        key = "fsdp " + s.name
        out[key] = rel(run(pg, s), run(gloo, s))
        assert out[key] <= 1e-5, (key, out[key])


def functional(r, n, pg, gloo):
    """torch.distributed._functional_collectives on the group (by name,
    through the C++ registry) and on a 1-D mesh, against gloo."""
    x = val(r, (3, 4), salt=1)
    checks = {
        "all_reduce": lambda g: funcol.all_reduce(x, "sum", g),
        "all_reduce max": lambda g: funcol.all_reduce(x, "max", g),
        "all_gather_tensor": lambda g: funcol.all_gather_tensor(x, 0, g),
        "all_gather_tensor dim 1": lambda g: funcol.all_gather_tensor(x, 1, g),
        "reduce_scatter_tensor": lambda g: funcol.reduce_scatter_tensor(val(r, (n * 2, 3), salt=2),
                                                                        "sum", 0, g),
        "all_to_all_single": lambda g: funcol.all_to_all_single(val(r, (n * 2,), salt=3), None, None, g),
        "broadcast": lambda g: funcol.broadcast(val(r, (5,), salt=4), 1, g),
        "all_reduce_coalesced": lambda g: funcol.all_reduce_coalesced(
            [x, val(r, (2,), salt=5)], "sum", g),
        "all_gather_into_tensor_coalesced": lambda g: funcol.all_gather_into_tensor_coalesced(
            [x, val(r, (2,), salt=6)], g),
        "reduce_scatter_tensor_coalesced": lambda g: funcol.reduce_scatter_tensor_coalesced(
            [val(r, (n * 2,), salt=7), val(r, (n,), salt=8)], "sum", [0, 0], g),
    }
    for name, fn in checks.items():
        a, b = fn(pg), fn(gloo)
        if isinstance(a, list):  # the coalesced forms
            a, b = torch.cat([t.reshape(-1) for t in a]), torch.cat([t.reshape(-1) for t in b])
        same(funcol.wait_tensor(a), funcol.wait_tensor(b), "funcol " + name)
    # gloo's coalesced reduce-scatter sums whatever the op (torch 2.6): max
    # against the local result instead
    got = funcol.reduce_scatter_tensor_coalesced([val(r, (n * 2,), salt=7), val(r, (n,), salt=8)],
                                                 "max", [0, 0], pg)
    for t, (k, salt) in zip(got, ((2, 7), (1, 8))):
        want = torch.stack([val(q, (n * k,), salt=salt) for q in range(n)]).max(0).values
        same(funcol.wait_tensor(t), want[r * k:(r + 1) * k], "reduce_scatter_tensor_coalesced max")
    # all_reduce_coalesced with every op (the coalescing manager's fast path)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        got = []
        for g in (pg, gloo):
            ts = [val(r, (3,), torch.float64, salt=14), val(r, (2, 2), torch.float64, salt=15)]
            with dist._coalescing_manager(g):
                for t in ts:
                    dist.all_reduce(t, op=op, group=g)
            got.append(torch.cat([t.reshape(-1) for t in ts]))
        same(got[0], got[1], "all_reduce_coalesced %s" % op)
    # object collectives (pickled into byte tensors on the group's device)
    objs = [{"rank": r, "s": "x" * r}, [r] * (r + 1)]
    for name, fn in (("all_gather_object", lambda g: _all_gather_object(objs[r % 2], g)),
                     ("broadcast_object_list", lambda g: _broadcast_object_list(objs, r, g)),
                     ("scatter_object_list", lambda g: _scatter_object_list(n, r, g)),
                     ("gather_object", lambda g: _gather_object(objs[0], n, r, g))):
        a, b = fn(pg), fn(gloo)
        assert a == b, (name, a, b)
    # autograd through a functional collective
    w = val(r, (4,), salt=9).requires_grad_()
    funcol.all_gather_tensor_autograd(w, 0, pg).sum().backward()
    same(w.grad, torch.full((4,), float(n)), "all_gather_tensor_autograd grad")


def _all_gather_object(obj, g):
    out = [None] * dist.get_world_size(g)
    dist.all_gather_object(out, obj, group=g)
    return out


def _broadcast_object_list(objs, r, g):
    lst = list(objs) if r == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1, group=g)
    return lst


def _scatter_object_list(n, r, g):
    out = [None]
    dist.scatter_object_list(out, [{"to": q, "pad": "y" * q} for q in range(n)] if r == 2 else None,
                             src=2, group=g)
    return out


def _gather_object(obj, n, r, g):
    out = [None] * n if r == 0 else None
    dist.gather_object(dict(obj, rank=r), out, dst=0, group=g)
    return out


def meshes(r, n, pg, gloo, out):
    """A 1-D mesh (the default group) and a 2-D mesh (2 x n/2, groups made
    by DeviceMesh, all on gocoll) against the same meshes over gloo groups
    (DeviceMesh.from_group): collectives per dimension, functional
    collectives on (mesh, dim), and DTensor redistributions."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    m1 = init_device_mesh("cpu", (n,))
    assert dist.get_backend(m1.get_group()) == "gocoll"
    g1 = DeviceMesh.from_group(gloo, "cpu")
    same(funcol.all_reduce(val(r, (6,), salt=10), "sum", m1),
         funcol.all_reduce(val(r, (6,), salt=10), "sum", g1), "1-D mesh all_reduce")

    rows = n // 2
    m2 = init_device_mesh("cpu", (2, rows), mesh_dim_names=("dp", "tp"))
    layout = torch.arange(n).reshape(2, rows)
    gdp, gtp = None, None
    for c in range(rows):  # every rank makes every gloo group, in the same order
        g = dist.new_group(layout[:, c].tolist(), backend="gloo")
        if r in layout[:, c].tolist():
            gdp = g
    for row in range(2):
        g = dist.new_group(layout[row].tolist(), backend="gloo")
        if r in layout[row].tolist():
            gtp = g
    g2 = DeviceMesh.from_group([gdp, gtp], "cpu", mesh=layout, mesh_dim_names=("dp", "tp"))
    for k, dim in enumerate(("dp", "tp")):
        assert dist.get_backend(m2.get_group(dim)) == "gocoll"
        t, u = val(r, (5,), salt=11), val(r, (5,), salt=11)
        dist.all_reduce(t, group=m2.get_group(dim))
        dist.all_reduce(u, group=g2.get_group(dim))
        same(t, u, "2-D mesh all_reduce over " + dim)
        same(funcol.all_gather_tensor(val(r, (3,), salt=12), 0, (m2, k)),
             funcol.all_gather_tensor(val(r, (3,), salt=12), 0, (g2, k)), "funcol on (mesh, %s)" % dim)
    # DTensor: a global tensor sharded on both dims, a matmul, redistributions
    torch.manual_seed(5)
    a, b = torch.randn(8, 6), torch.randn(6, 4)
    res = []
    for mesh in (m2, g2):
        da = distribute_tensor(a, mesh, [Shard(0), Shard(1)])
        db = distribute_tensor(b, mesh, [Replicate(), Shard(0)])
        prod = (da @ db).redistribute(mesh, [Replicate(), Replicate()]).to_local()
        shards = distribute_tensor(a, mesh, [Shard(1), Replicate()]).redistribute(
            mesh, [Replicate(), Shard(0)]).to_local()
        res.append((prod, shards))
    out["dtensor matmul vs gloo"] = rel(res[0][0], res[1][0])
    assert out["dtensor matmul vs gloo"] <= 1e-6, out
    out["dtensor matmul vs local"] = rel(res[0][0], a @ b)
    assert out["dtensor matmul vs local"] <= 1e-5, out
    same(res[0][1], res[1][1], "DTensor redistribute")


def checkpoint(r, n, pg, gloo, out, ckpt):
    """torch.distributed.checkpoint over gocoll: the sharded state of an
    FSDP model and its optimizer saved over gocoll loads into a model
    sharded over gloo and over gocoll, equal to what was saved; saved over
    gloo instead, the data files are the same bytes as with async_save over
    gocoll; a plain state dict round-trips."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def sharded(group, steps):
        f = FSDP(model(), process_group=group, device_id=torch.device("cpu"), use_orig_params=True)
        opt = torch.optim.Adam(f.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(300 + r)
        for _ in range(steps):
            opt.zero_grad()
            f(torch.randn(8, 16, generator=g)).square().mean().backward()
            opt.step()
        return f, opt

    def full(f):
        with FSDP.summon_full_params(f):
            return flat(f)

    def state(f, opt):
        m, o = get_state_dict(f, opt)
        return {"model": m, "optim": o}

    def files(name):
        d = os.path.join(ckpt, name)
        return {k: open(os.path.join(d, k), "rb").read() for k in sorted(os.listdir(d))}

    src, src_opt = sharded(pg, 3)
    saved = full(src)
    dcp.save(state(src, src_opt), checkpoint_id=os.path.join(ckpt, "a"), process_group=pg)
    for group in (gloo, pg):
        dst, dst_opt = sharded(group, 0)
        sd = state(dst, dst_opt)
        dcp.load(sd, checkpoint_id=os.path.join(ckpt, "a"), process_group=group)
        set_state_dict(dst, dst_opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        same(full(dst), saved, "checkpoint loaded over " + dist.get_backend(group))
    # the optimizer's state came back too: one more step is the same step
    for f, o in ((src, src_opt), (dst, dst_opt)):
        o.zero_grad()
        f(val(r, (8, 16), salt=16)).square().mean().backward()
        o.step()
    same(full(dst), full(src), "a step after loading")
    dcp.save(state(src, src_opt), checkpoint_id=os.path.join(ckpt, "b"), process_group=gloo)
    dcp.async_save(state(src, src_opt), checkpoint_id=os.path.join(ckpt, "c"),
                   process_group=pg).result()
    dist.barrier()
    # (.metadata names the checkpoint's own path)
    data = {k: v for k, v in files("b").items() if k.endswith(".distcp")}
    assert data and data == {k: v for k, v in files("c").items() if k.endswith(".distcp")}, \
        "saved over gloo and over gocoll (async) differ"
    plain = {"w": val(0, (7,), salt=13), "step": 3}
    dcp.save(plain, checkpoint_id=os.path.join(ckpt, "d"), process_group=pg)
    back = {"w": torch.zeros(7), "step": 0}
    dcp.load(back, checkpoint_id=os.path.join(ckpt, "d"), process_group=pg)
    same(back["w"], plain["w"], "plain checkpoint")
    assert back["step"] == 3, back
    out["checkpoint files"] = sorted(files("c"))


def groups(r, n, pg, gloo, out):
    """The 2.x group API on gocoll: names, batch_isend_irecv, the
    coalescing manager, new_subgroups, split_group (torch's refuses CPU
    groups; gocoll.torch.split_group makes them), monitored_barrier."""
    assert pg.group_name == dist.distributed_c10d._get_process_group_name(pg), pg.group_name
    assert dist.distributed_c10d._resolve_process_group(pg.group_name) is pg
    nxt, prv = (r + 1) % n, (r - 1) % n
    for group in (pg, gloo):
        a, b = torch.empty(3), torch.empty(2, dtype=torch.int64)
        ops = [dist.P2POp(dist.isend, val(r, (3,), salt=20), nxt, group),
               dist.P2POp(dist.irecv, a, prv, group),
               dist.P2POp(dist.irecv, b, nxt, group),
               dist.P2POp(dist.isend, val(r, (2,), torch.int64, salt=21), prv, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        same(a, val(prv, (3,), salt=20), "batch_isend_irecv from prev")
        same(b, val(nxt, (2,), torch.int64, salt=21), "batch_isend_irecv from next")
    # tagged, received in another order than sent (gloo matches tags alike)
    got = {t: torch.empty(t + 1) for t in (5, 6, 7)}
    ops = [dist.P2POp(dist.isend, val(r, (t + 1,), salt=t), nxt, pg, tag=t) for t in (5, 6, 7)]
    ops += [dist.P2POp(dist.irecv, got[t], prv, pg, tag=t) for t in (7, 5, 6)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for t, x in got.items():
        same(x, val(prv, (t + 1,), salt=t), "batch_isend_irecv tag %d" % t)
    # the coalescing manager: the fast path (captured, one coalesced call),
    # and with the device given (each call issued, one work for all; gloo
    # refuses that form)
    def coalesced(group, device):
        ts = [val(r, (3,), salt=22), val(r, (4,), salt=23)]
        outs = [torch.empty(3 * n), torch.empty(4 * n)]
        with dist._coalescing_manager(group, device, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, group=group)
        cm.wait()
        with dist._coalescing_manager(group, device):
            for o, t in zip(outs, ts):
                dist.all_gather_into_tensor(o, t, group=group)
        return torch.cat(ts + outs)
    want = coalesced(gloo, None)
    same(coalesced(pg, None), want, "coalescing manager")
    same(coalesced(pg, torch.device("cpu")), want, "coalescing manager with the device")
    sub, subs = dist.new_subgroups(2)
    assert dist.get_backend(sub) == "gocoll" and len(subs) == n // 2
    t = val(r, (2,), salt=24)
    dist.all_reduce(t, group=sub)
    first = r - r % 2
    same(t, val(first, (2,), salt=24) + val(first + 1, (2,), salt=24), "new_subgroups")
    expect_raises(RuntimeError, dist.split_group, split_ranks=[[0, 1]], contains="device")
    half = gt.split_group(split_ranks=[list(range(0, n, 2)), list(range(1, n, 2))])
    assert dist.get_process_group_ranks(half) == list(range(r % 2, n, 2)), dist.get_process_group_ranks(half)
    lone = gt.split_group(sub, split_ranks=[[0]])  # a subgroup's split: its own ranks only
    assert (lone is None) == (r % 2 == 1), lone
    if lone is not None:
        assert dist.get_process_group_ranks(lone) == [r], dist.get_process_group_ranks(lone)
    t = val(r, (2,), salt=25)
    dist.all_reduce(t, group=half)
    same(t, sum(val(q, (2,), salt=25) for q in range(r % 2, n, 2)), "split_group all_reduce")
    gt.monitored_barrier(timeout=datetime.timedelta(seconds=60), wait_all_ranks=True)
    # torch 2.6's dist.monitored_barrier is gloo's only (it checks the name)
    expect_raises(ValueError, dist.monitored_barrier, contains="GLOO")
    opts = dist.new_group(pg_options=gt.Options(algo="allreduce=ring"))
    t = val(r, (9,), salt=26)
    dist.all_reduce(t, group=opts)
    same(t, sum(val(q, (9,), salt=26) for q in range(n)), "group with pg_options")
    expect_raises(TypeError, dist.new_group, pg_options={"algo": "ring"}, contains="Options")
    out["group names"] = [pg.group_name, sub.group_name, half.group_name]


def run():
    dist.init_process_group("gocoll", timeout=datetime.timedelta(seconds=120))
    r, n = dist.get_rank(), dist.get_world_size()
    assert n == 4, "the 2-D mesh wants 4 ranks"
    pg = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    ckpt = sys.argv[1]
    out = {}
    checked = []
    for name, fn, args in (("ddp", ddp, (out,)), ("fsdp", fsdp, (out,)), ("functional", functional, ()),
                           ("meshes", meshes, (out,)), ("checkpoint", checkpoint, (out, ckpt)),
                           ("groups", groups, (out,))):
        fn(r, n, pg, gloo, *args)
        checked.append(name)
        dist.barrier()
    # destroy: every group, then a fresh default group works (2.6 needs
    # the group names for this)
    dist.destroy_process_group()
    assert not dist.is_initialized()
    dist.init_process_group("gocoll", init_method="env://")
    t = torch.ones(1)
    dist.all_reduce(t)
    same(t, torch.full((1,), float(n)), "after destroy and init")
    dist.destroy_process_group()
    checked.append("destroy")
    out["checked"] = checked
    out["torch"] = torch.__version__
    report(out)


if __name__ == "__main__":
    main(run)
