"""Data-parallel training of a small MLP on synthetic data with gocoll.

    /usr/bin/torchrun --nproc_per_node 4 --redirects 1 --tee 1 \\
        bridge/python/examples/train_mlp.py [--steps 200] [--mode dg|ddp-hook]

--mode dg        gocoll.torch.DistributedGradients: gradient buckets are
                 averaged by gocoll while backward runs (default).
--mode ddp-hook  torch DDP over a gloo process group, with gradients averaged
                 by gocoll through gocoll.torch.allreduce_hook.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
gocoll.init() reads them. torchrun's TCP store owns MASTER_PORT, so gocoll's
rendezvous listens on MASTER_PORT+1 (or GOCOLL_PORT) and torch.distributed
and gocoll live side by side in one process. (Debian's torch 1.13 torchrun
needs --redirects 1 --tee 1 on Python 3.11.)

Each rank draws its own shard of a regression problem whose targets come
from a fixed random "teacher" network; the loss printed by rank 0 falls as
the student learns it.
"""

import argparse
import os
import sys
import time

import torch
from torch import nn

try:
    import gocoll
except ImportError:  # running from a checkout: bridge/python is the package root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import gocoll
import gocoll.torch as gt

D_IN, D_H, D_OUT = 32, 128, 8


def mlp():
    return nn.Sequential(nn.Linear(D_IN, D_H), nn.ReLU(), nn.Linear(D_H, D_H), nn.ReLU(),
                         nn.Linear(D_H, D_OUT))


def shard(teacher, rank, step, batch):
    g = torch.Generator().manual_seed(rank * 1_000_003 + step)
    x = torch.randn(batch, D_IN, generator=g)
    with torch.no_grad():
        y = teacher(x)
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--mode", choices=["dg", "ddp-hook"], default="dg")
    ap.add_argument("--log-every", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    comm = gocoll.init()  # torchrun's environment; rendezvous on MASTER_PORT+1
    rank, size = comm.rank, comm.size
    torch.manual_seed(0)
    teacher = mlp()
    torch.manual_seed(1 + rank)  # deliberately different: broadcast_parameters fixes it
    model = mlp()

    if args.mode == "dg":
        gt.broadcast_parameters(model, comm, root=0)
        grads = gt.DistributedGradients(model, comm, bucket_cap_mb=1)
        opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9), grads)
        net = model
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")  # torchrun's store on MASTER_PORT
        net = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
        net.register_comm_hook(comm, gt.allreduce_hook)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)

    if rank == 0:
        print("gocoll %s (%s), %d ranks, mode %s" % (gocoll.__version__, gocoll.library_path(), size,
                                                     args.mode), flush=True)
    t0 = time.perf_counter()
    first = None
    for step in range(args.steps):
        x, y = shard(teacher, rank, step, args.batch)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        # the global mean loss, for the log
        l = loss.detach().reshape(1).clone()
        comm.all_reduce(l, op="avg")
        if first is None:
            first = l.item()
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print("step %4d  loss %.5f" % (step, l.item()), flush=True)
    took = time.perf_counter() - t0

    # every rank must hold the same weights
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    comm.all_reduce(hi, op="max")
    comm.all_reduce(lo, op="min")
    spread = (hi - lo).abs().max().item()
    if rank == 0:
        print("done: %d steps in %.2fs (%.2f ms/step), loss %.5f -> %.5f, weight spread across ranks %g"
              % (args.steps, took, 1000 * took / args.steps, first, l.item(), spread), flush=True)
    comm.destroy()
    if args.mode == "ddp-hook":
        import torch.distributed as dist
        dist.destroy_process_group()
    if spread != 0.0 or not l.item() < first:
        sys.exit(1)


if __name__ == "__main__":
    main()
