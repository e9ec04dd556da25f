"""20 SGD-with-momentum steps of an MLP on every rank, four ways, each
compared with one process training on the concatenated batch:

  dg        gocoll.torch.DistributedGradients (+ DistributedOptimizer)
  ddp_hook  DDP over a gloo process group with gocoll.torch.allreduce_hook
  ddp_gloo  plain DDP over gloo
  unused    DistributedGradients on a model whose second head is used only
            by rank 0 on even steps (parameters without gradients must not
            hang the job): with gradients zeroed (a parameter no rank used
            gets a zero average, as in one process), and with gradients set
            to None (torch 2.x's zero_grad default) and
            find_unused_parameters, where such a parameter keeps None and
            the optimizer skips it, as in one process

gloo's store takes MASTER_PORT, gocoll's rendezvous MASTER_PORT+1."""

import os

import torch
import torch.distributed as dist
from torch import nn

import gocoll
import gocoll.torch as gt
from common import main, rank_size, report

STEPS = 20
PER_RANK = 8
D_IN, D_H, D_OUT = 16, 64, 4
LR, MOMENTUM = 0.05, 0.9
BUCKET_MB = 0.02  # ~20 KiB: several buckets, so launches overlap backward


class MLP(nn.Module):
    def __init__(self, two_heads=False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(D_IN, D_H), nn.Tanh(), nn.Linear(D_H, D_H), nn.Tanh())
        self.head = nn.Linear(D_H, D_OUT)
        self.head2 = nn.Linear(D_H, D_OUT) if two_heads else None

    def forward(self, x, use2=False):
        h = self.body(x)
        y = self.head(h)
        if use2:
            y = y + self.head2(h)
        return y


def make_model(two_heads=False):
    torch.manual_seed(1234)  # identical initial weights everywhere
    return MLP(two_heads).double() if os.environ.get("EQUIV_DOUBLE") else MLP(two_heads)


def batch(step, n):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n * PER_RANK, D_IN, generator=g)
    y = torch.randn(n * PER_RANK, D_OUT, generator=g)
    if os.environ.get("EQUIV_DOUBLE"):
        x, y = x.double(), y.double()
    return x, y


def uses_head2(rank, step):
    return rank == 0 and step % 2 == 0


def reference(n, two_heads=False, set_to_none=False):
    """One process, concatenated batch. With two heads, the loss is the mean
    of the ranks' losses, each rank using head2 as it would."""
    m = make_model(two_heads)
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step, n)
        opt.zero_grad(set_to_none=set_to_none)
        if two_heads:
            loss = sum(nn.functional.mse_loss(m(x[q * PER_RANK:(q + 1) * PER_RANK], uses_head2(q, step)),
                                              y[q * PER_RANK:(q + 1) * PER_RANK]) for q in range(n)) / n
        else:
            loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
    return m


def local(step, rank, n):
    x, y = batch(step, n)
    return x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]


def train_dg(comm, rank, n, two_heads=False, set_to_none=False):
    m = make_model(two_heads)
    gt.broadcast_parameters(m, comm, root=0)
    dg = gt.DistributedGradients(m, comm, bucket_cap_mb=BUCKET_MB, find_unused_parameters=set_to_none)
    assert len(dg.buckets) > 1, dg.buckets
    assert dg.uses_gocoll_memory
    opt = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM), dg)
    launched_in_backward = 0
    for step in range(STEPS):
        x, y = local(step, rank, n)
        opt.zero_grad(set_to_none=set_to_none)
        loss = nn.functional.mse_loss(m(x, two_heads and uses_head2(rank, step)), y)
        loss.backward()
        launched_in_backward += dg._next
        opt.step()
    return m, launched_in_backward


def train_ddp(rank, n, hook_comm=None):
    m = make_model()
    ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=BUCKET_MB)
    if hook_comm is not None:
        ddp.register_comm_hook(hook_comm, gt.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = local(step, rank, n)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return m


def rel_err(a, b):
    """max over parameters of max|a-b| / max|b|."""
    worst = 0.0
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        d = (pa.detach() - pb.detach()).abs().max().item()
        s = pb.detach().abs().max().item()
        worst = max(worst, d / max(s, 1e-30))
    return worst


def elem_rel_err(a, b):
    """max over elements of |a-b| / max(|b|, 1e-3)."""
    worst = 0.0
    for pa, pb in zip(a.parameters(), b.parameters()):
        worst = max(worst, ((pa.detach() - pb.detach()).abs() / pb.detach().abs().clamp_min(1e-3)).max().item())
    return worst


def work():
    torch.set_num_threads(1)
    rank, n = rank_size()
    dist.init_process_group("gloo")  # MASTER_PORT
    comm = gocoll.init()  # MASTER_PORT + 1
    ref = reference(n)
    ref2 = reference(n, two_heads=True)
    out = {}
    m, launched = train_dg(comm, rank, n)
    out["dg_vs_single"] = rel_err(m, ref)
    out["dg_vs_single_elem"] = elem_rel_err(m, ref)
    out["dg_buckets_launched_during_backward"] = launched
    m_hook = train_ddp(rank, n, hook_comm=comm)
    out["ddp_hook_vs_single"] = rel_err(m_hook, ref)
    m_gloo = train_ddp(rank, n)
    out["ddp_gloo_vs_single"] = rel_err(m_gloo, ref)
    out["dg_vs_ddp_gloo"] = rel_err(m, m_gloo)
    out["ddp_hook_vs_ddp_gloo"] = rel_err(m_hook, m_gloo)
    m2, _ = train_dg(comm, rank, n, two_heads=True)
    out["unused_vs_single"] = rel_err(m2, ref2)
    m3, _ = train_dg(comm, rank, n, two_heads=True, set_to_none=True)
    out["unused_none_vs_single"] = rel_err(m3, reference(n, two_heads=True, set_to_none=True))
    # every rank ends with identical parameters
    flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    mx, mn = flat.clone(), flat.clone()
    comm.all_reduce(mx, op="max")
    comm.all_reduce(mn, op="min")
    out["dg_rank_spread"] = (mx - mn).abs().max().item()
    comm.destroy()
    dist.destroy_process_group()
    report(out)


main(work)
