"""gocoll.vppu.VirtualComm across processes: 8 virtual devices in blocks,
numpy and torch buffers, results equal to the fold in device order, then a
migration onto the first half of the ranks and the same bits again."""

import numpy as np
import torch

import gocoll
from common import expect_raises, main, report

NDEV, COUNT = 8, 1001


def weights(v):
    rng = np.random.default_rng(v)
    return (rng.standard_normal(COUNT) * (v + 1)).astype(np.float32)


def reference():
    acc = weights(0).copy()
    for v in range(1, NDEV):
        acc = (acc + weights(v)).astype(np.float32)  # float32, device order
    return acc


def allreduce_registered(vc):
    devs = vc.devices
    grads = [vc.buffer(d, "w", dtype=np.float32) for d in devs]
    out = [np.empty(COUNT, np.float32) for _ in devs]
    vc.allreduce(grads, out=out)
    return devs, out


def work():
    c = gocoll.init()
    vc = gocoll.vppu.VirtualComm(c, "ring", NDEV)
    devs = vc.devices
    assert all(vc.device_rank(d) == c.rank for d in devs), devs
    for d in devs:
        vc.register(d, "w", weights(d))
    ref = reference()
    _, out = allreduce_registered(vc)
    assert all(np.array_equal(o.view(np.uint32), ref.view(np.uint32)) for o in out)

    # torch, in place and non-blocking; allgather; broadcast.
    ts = [torch.from_numpy(weights(d)) for d in devs]
    vc.allreduce(ts, async_op=True).wait()
    assert all(torch.equal(t, torch.from_numpy(ref)) for t in ts)
    ids = [np.array([100 + d], np.int32) for d in devs]
    got = [np.empty(NDEV, np.int32) for _ in devs]
    vc.allgather(ids, got)
    assert all(list(g) == [100 + v for v in range(NDEV)] for g in got), got
    vc.broadcast(ids, root=5)
    assert all(int(i[0]) == 105 for i in ids), ids
    tables = vc.tables()
    assert tables["tables"]["virtual"][0] == [1, NDEV - 1], tables
    expect_raises(gocoll.InvalidArgument, vc.allreduce, [np.zeros(3, np.float32)] * (len(devs) + 1))

    # Resharding the devices' rows: row bands over 8 devices into 3x3 tiles
    # dealt to 5 devices, through the virtual communicator.
    full = np.arange(16 * 12, dtype=np.float64).reshape(16, 12)
    a = gocoll.vppu.Map.block((16, 12), dim=0, devices=NDEV)
    b = gocoll.vppu.Map((16, 12), (3, 3), 5, assign="cyclic")
    with gocoll.vppu.Plan.maps(a, b) as plan:
        srcs = [full[d * 2:d * 2 + 2].reshape(-1).copy() for d in devs]
        dsts = [np.full(plan.counts(d)[1], -1.0) if d < 5 else None for d in devs]
        vc.redistribute(plan, srcs, dsts)
        for d, out in zip(devs, dsts):
            if out is None:
                continue
            want = [full[t // 4 * 3:t // 4 * 3 + 3, t % 4 * 3:t % 4 * 3 + 3].reshape(-1) for t in range(d, 6 * 4, 5)]
            assert np.array_equal(out, np.concatenate(want)), (d, out)

    half = max(c.size // 2, 1)
    vc.migrate([v * half // NDEV for v in range(NDEV)])
    after = vc.devices
    res = {"before": devs, "after": after}
    if after:
        _, out = allreduce_registered(vc)
        assert all(np.array_equal(o.view(np.uint32), ref.view(np.uint32)) for o in out)
        for d in after:
            assert np.array_equal(vc.buffer(d, "w", dtype=np.float32), weights(d)), d
    else:
        expect_raises(gocoll.InvalidArgument, vc.barrier)
    vc.close()
    c.barrier()
    c.destroy()
    report(res)


main(work)
