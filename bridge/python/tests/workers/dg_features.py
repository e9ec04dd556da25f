"""DistributedGradients details: no_sync accumulation, zero_grad(set_to_none),
find_unused_parameters, gradient_as_bucket_view=False, mixed dtypes, and the
error for two backward passes without synchronize. Each rank computes every
rank's gradients locally to know the expected average."""


import torch
from torch import nn

import gocoll
import gocoll.torch as gt
from common import expect_raises, main, report


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(5, 3)
        self.c = nn.Linear(5, 3)  # the optional head
        self.scale = nn.Parameter(torch.ones(3, dtype=torch.float64))  # another dtype

    def forward(self, x, use_c):
        h = torch.relu(self.a(x))
        y = self.b(h)
        if use_c:
            y = y + self.c(h)
        return (y.double() * self.scale).sum()


def data(rank, micro):
    g = torch.Generator().manual_seed(100 * rank + micro)
    return torch.randn(4, 6, generator=g)


def expected(n, micros, use_c):
    """Average over ranks of the sum over micro-batches of the gradients;
    None where no rank produced one."""
    acc = None
    for q in range(n):
        m = Net()
        for k in micros:
            m(data(q, k), use_c(q)).backward()
        grads = [p.grad for p in m.parameters()]
        if acc is None:
            acc = [None if g is None else g.clone() for g in grads]
        else:
            for i, g in enumerate(grads):
                if g is not None:
                    acc[i] = g.clone() if acc[i] is None else acc[i] + g
    return [None if g is None else g / n for g in acc]


def compare(model, want, what):
    for (name, p), w in zip(model.named_parameters(), want):
        if w is None:
            assert p.grad is None, "%s: %s has a gradient, expected none" % (what, name)
            continue
        assert p.grad is not None, "%s: %s has no gradient" % (what, name)
        assert torch.allclose(p.grad, w, rtol=1e-5, atol=1e-6), "%s: %s\n%s\n%s" % (what, name, p.grad, w)


def work():
    torch.set_num_threads(1)
    comm = gocoll.init()
    r, n = comm.rank, comm.size
    out = {}

    # plain step with mixed dtypes (float32 + float64 buckets); head c unused by rank 1
    m = Net()
    dg = gt.DistributedGradients(m, comm, bucket_cap_mb=1e-4)
    out["buckets"] = [(str(d), k, idx) for d, k, idx in dg.buckets]
    assert {d for d, _, _ in dg.buckets} == {torch.float32, torch.float64}
    m(data(r, 0), use_c=(r == 0)).backward()
    dg.synchronize()
    compare(m, expected(n, [0], lambda q: q == 0), "mixed dtypes / partly unused")
    grad_ptrs = [p.grad.data_ptr() for p in m.parameters()]

    # second step, zero_grad keeps the bucket views: no copies, same storage
    for p in m.parameters():
        p.grad.zero_()
    m(data(r, 1), use_c=True).backward()
    dg.synchronize()
    compare(m, expected(n, [1], lambda q: True), "step 2 (bucket views)")
    assert [p.grad.data_ptr() for p in m.parameters()] == grad_ptrs

    # two backward passes without synchronize: a clear error, not a hang
    m(data(r, 2), use_c=True).backward()
    e = expect_raises(RuntimeError, m(data(r, 3), use_c=True).backward, contains="synchronize")
    out["double_backward"] = str(e)
    dg.synchronize()
    dg.remove()

    # gradient accumulation: two micro-batches in no_sync, one outside
    m = Net()
    dg = gt.DistributedGradients(m, comm)
    with dg.no_sync():
        m(data(r, 0), True).backward()
        m(data(r, 1), True).backward()
    m(data(r, 2), True).backward()
    dg.synchronize()
    compare(m, expected(n, [0, 1, 2], lambda q: True), "no_sync accumulation")
    dg.remove()

    # zero_grad(set_to_none=True) + find_unused_parameters: head c used by
    # nobody keeps grad None; used by rank 0 only gets the average
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    dg = gt.DistributedGradients(m, comm, find_unused_parameters=True)
    for step, user in enumerate([None, 0, None]):
        opt.zero_grad(set_to_none=True)
        m(data(r, step), use_c=(r == user)).backward()
        dg.step(opt)
        compare(m, expected(n, [step], lambda q: q == user), "find_unused step %d" % step)
    dg.remove()

    # gradient_as_bucket_view=False: .grad keeps its own storage
    m = Net()
    dg = gt.DistributedGradients(m, comm, gradient_as_bucket_view=False)
    m(data(r, 0), True).backward()
    before = [p.grad.data_ptr() for p in m.parameters()]
    dg.synchronize()
    assert [p.grad.data_ptr() for p in m.parameters()] == before
    compare(m, expected(n, [0], lambda q: True), "no bucket views")
    dg.remove()

    # broadcast_parameters: rank-specific weights become rank 0's
    m = Net()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(r)
    m.register_buffer("steps", torch.tensor([10 * r], dtype=torch.int64))
    gt.broadcast_parameters(m, comm, root=0)
    ref = Net()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    assert m.steps.item() == 0

    # the DDP hook alone, on a fake bucket (no process group needed)
    class Bucket:
        def __init__(self, t):
            self.t = t

        def buffer(self):
            return self.t

    t = torch.full((1000,), float(r))
    fut = gt.allreduce_hook(comm, Bucket(t))
    res = fut.wait()
    assert res is t and torch.all(t == sum(range(n)) / n)
    comm.destroy()
    e = gt.allreduce_hook(comm, Bucket(t))
    expect_raises(RuntimeError, e.wait, contains="destroyed")
    report(out)


main(work)
