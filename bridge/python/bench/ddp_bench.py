"""Training-step time of PyTorch data parallelism through gocoll and Gloo.

    /usr/bin/python3 bridge/python/bench/ddp_bench.py [--ranks 2,4] [--rounds 8] [--steps 5]
        [--models mlp,cnn] [--batches 32,64] [--out build/perf/torch-DATE.md]

Starts the ranks itself (fresh interpreters with torchrun-style variables,
one job per rank count). Every rank builds, for each model, one copy per
route from the same seed:

  none         forward + backward + SGD step, no communication (the floor)
  ddp-gloo     DistributedDataParallel on a Gloo process group
  ddp-gocoll   DistributedDataParallel on the "gocoll" backend
               (dist.new_group(backend="gocoll"))
  hook         DDP on Gloo with gocoll.torch.allreduce_hook (another gocoll group's communicator)
  dg           gocoll.torch.DistributedGradients + DistributedOptimizer

and four routes that bound what any communication library could reach on
this machine (the floor; they do not train the same weights):

  ddp-noop     DDP whose comm hook returns its bucket at once: DDP's own work
               (bucketing, copies, autograd hooks) with no communication
  sync         the plain step, then one gocoll barrier: the cost of running
               the ranks in lockstep (with more ranks than cores, or uneven
               ranks, a rank waits for the slowest every step)
  allreduce    no compute: one gocoll allreduce of all the model's gradient
               bytes in a gocollMemAlloc buffer, the fastest gocoll moves
               them (the communication's own cost)
  allreduce-plain  the same in an ordinary tensor, as DDP's buckets are

The floor of a cell adds what a route cannot avoid: sync + allreduce for
DistributedGradients (its buckets are gocollMemAlloc memory), sync +
ddp-noop + allreduce-plain for the DDP routes. The cores are busy
computing, so a communication's CPU time adds to the step however well it
overlaps, and the allreduce cannot finish before the slowest rank arrives.

and times single steps (same per-rank batch for every route) in rounds:
each round runs every (model, batch) and within it every route for
``--steps`` steps, in a rotated order, so that drift of a shared machine
falls on all routes alike; the first round is warm-up.

A step's time (--timing slowest, the default) is that of its slowest rank,
every step starting on all ranks together after a gocoll barrier (outside
the timing): what a synchronous data-parallel job waits for, so the floor's
"sync" is then close to zero. --timing rank0 takes rank 0's own step times
with the ranks running free between routes (the method of earlier reports):
a rank then also pays for being held back to the pace of the slowest rank,
which "sync" measures, and with more ranks than cores that dominates.

The report gives the median step time per cell, the communication overhead
(step − none) and its ratio to Gloo's overhead, and — since every route trained
from the same weights on the same data — the largest weight difference of
each route from ddp-gloo after the run (max |Δw| / max |w|; should be ≤ 1e-5).

Models: an MLP of ~3.2 M parameters (1024 → 1536 → 1024 → 10) and a small
CNN on 32×32 images. Debian's torch computes slowly (generic BLAS), so
compare overheads, not step times. With more ranks than cores the ranks
share cores: say so when quoting numbers.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.dirname(HERE)
sys.path.insert(0, BRIDGE)
sys.path.insert(0, os.path.join(BRIDGE, "tests"))

TRAIN = ["none", "ddp-gloo", "ddp-gocoll", "hook", "dg"]  # train the same weights
FLOOR = ["ddp-noop", "sync", "allreduce", "allreduce-plain"]  # bound the overhead from below
ROUTES = TRAIN + FLOOR
NAMES = {"none": "no communication", "ddp-gloo": "DDP, Gloo", "ddp-gocoll": "DDP, gocoll backend",
         "hook": "DDP, Gloo + gocoll hook", "dg": "DistributedGradients",
         "ddp-noop": "DDP, no-op hook", "sync": "step + barrier", "allreduce": "allreduce alone",
         "allreduce-plain": "allreduce alone, plain tensor"}
LR, MOMENTUM = 0.01, 0.9


# ---------------------------------------------------------------------------
# workers (one process per rank)


def _mlp(nn):
    return nn.Sequential(nn.Linear(1024, 1536), nn.ReLU(), nn.Linear(1536, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def _cnn(nn):
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(64, 10))


MODELS = {"mlp": (_mlp, (1024,)), "cnn": (_cnn, (3, 32, 32))}  # builder, input shape


def make_model(name):
    import torch
    from torch import nn
    torch.manual_seed(0)  # identical weights on every rank and route
    return MODELS[name][0](nn)


def batch_of(model, batch, rank):
    import torch
    g = torch.Generator().manual_seed(1000 * rank + batch)
    shape = (batch,) + MODELS[model][1]
    return torch.randn(shape, generator=g), torch.randint(0, 10, (batch,), generator=g)


def _ddp(groups, model, pg):
    from torch import nn
    return nn.parallel.DistributedDataParallel(model, process_group=groups[pg])


def _hook(groups, model):
    import gocoll.torch as gt
    net = _ddp(groups, model, "gloo")
    net.register_comm_hook(groups["hook"].comm, gt.allreduce_hook)
    return net


def _noop_hook(state, bucket):
    import torch
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _ddp_noop(groups, model):
    net = _ddp(groups, model, "gloo")
    net.register_comm_hook(None, _noop_hook)
    return net


# route -> what it wraps the model in (None: the model itself), and whether
# the optimizer goes through DistributedGradients
WRAP = {
    "none": (None, False),
    "ddp-gloo": (lambda g, m: _ddp(g, m, "gloo"), False),
    "ddp-gocoll": (lambda g, m: _ddp(g, m, "gocoll"), False),
    "hook": (_hook, False),
    "dg": (None, True),
    "ddp-noop": (_ddp_noop, False),
    "sync": (None, False),
    "allreduce": (None, False),
    "allreduce-plain": (None, False),
}


class Route:
    """One model copy trained through one route."""

    def __init__(self, route, model, groups):
        import torch
        from torch import nn
        import gocoll.torch as gt
        self.model = make_model(model)
        wrap, dg = WRAP[route]
        self.net = self.model if wrap is None else wrap(groups, self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)
        if dg:
            self.opt = gt.DistributedOptimizer(self.opt, gt.DistributedGradients(self.model,
                                                                                  groups["hook"].comm))
        self.loss = nn.functional.cross_entropy
        self.route = route
        self.comm = groups["hook"].comm
        if route.startswith("allreduce"):
            n = sum(p.numel() for p in self.model.parameters())
            self.flat = gt.empty(self.comm, (n,)) if route == "allreduce" else torch.empty(n)
            self.flat.zero_()

    def step(self, x, y):
        if self.route.startswith("allreduce"):
            self.comm.all_reduce(self.flat, op="avg")
            return
        self.opt.zero_grad()
        self.loss(self.net(x), y).backward()
        self.opt.step()
        if self.route == "sync":
            self.comm.barrier()

    def weights(self):
        import torch
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])


def worker(args):
    import torch
    import torch.distributed as dist

    import gocoll.torch  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = {"gloo": dist.new_group(backend="gloo"), "gocoll": dist.new_group(backend="gocoll"),
              "hook": dist.new_group(backend="gocoll")}
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit("unknown model(s) %s; known: %s" % (unknown, ", ".join(MODELS)))
    batches = [int(b) for b in args.batches.split(",")]
    routes = {(m, r): Route(r, m, groups) for m in models for r in ROUTES}
    data = {(m, b): batch_of(m, b, rank) for m in models for b in batches}
    times = {(m, b, r): [] for m in models for b in batches for r in ROUTES}
    align = groups["hook"].comm  # its barrier starts every rank's step together (µs apart)
    for rnd in range(args.rounds + 1):  # round 0: warm-up
        for m in models:
            for b in batches:
                x, y = data[(m, b)]
                k = (rnd + b) % len(ROUTES)
                for r in ROUTES[k:] + ROUTES[:k]:
                    route = routes[(m, r)]
                    dist.barrier(group=groups["gloo"])
                    for _ in range(args.steps):
                        if args.timing == "slowest":
                            align.barrier()
                        t0 = time.perf_counter()
                        route.step(x, y)
                        if rnd:
                            times[(m, b, r)].append(time.perf_counter() - t0)
    if args.timing == "slowest":
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, times, group=groups["gloo"])
        times = {key: [max(ts) for ts in zip(*(t[key] for t in every))] for key in times}
    out = {"cells": [], "params": {}, "weights": {}}
    for m in models:
        out["params"][m] = sum(p.numel() for p in routes[(m, "none")].model.parameters())
        ref = routes[(m, "ddp-gloo")].weights()
        scale = ref.abs().max().item()
        out["weights"][m] = {r: ((routes[(m, r)].weights() - ref).abs().max().item() / scale)
                             for r in TRAIN if r not in ("none", "ddp-gloo")}
        for b in batches:
            out["cells"].append({"model": m, "batch": b, "median_ms": {
                r: 1000 * statistics.median(times[(m, b, r)]) for r in ROUTES},
                "steps": len(times[(m, b, "none")])})
    dist.barrier(group=groups["gloo"])
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # every group at once: nothing needs an orderly goodbye


# ---------------------------------------------------------------------------
# driver


def floors(ms):
    """(floor of the DDP routes, floor of DistributedGradients): overheads
    in ms that no library could go below on this machine (module doc)."""
    sync = ms["sync"] - ms["none"]
    noop = ms["ddp-noop"] - ms["none"]
    return sync + noop + ms["allreduce-plain"], sync + ms["allreduce"]


def table(results, args):
    lines = ["| ranks | model | batch | %s | %s | %s | %s | %s |" % tuple(NAMES[r] for r in TRAIN),
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for n, res in results:
        for c in res["cells"]:
            ms = c["median_ms"]
            gloo = ms["ddp-gloo"] - ms["none"]
            cells = ["%.1f ms" % ms["none"], "%.1f (+%.1f)" % (ms["ddp-gloo"], gloo)]
            for r in ("ddp-gocoll", "hook", "dg"):
                over = ms[r] - ms["none"]
                ratio = "%.2f×" % (over / gloo) if gloo > 0 else "n/a"
                cells.append("%.1f (+%.1f, %s)" % (ms[r], over, ratio))
            lines.append("| %d | %s | %d | %s |" % (n, c["model"], c["batch"], " | ".join(cells)))
    lines.append("")
    who = "the slowest rank's" if args.timing == "slowest" else "rank 0's"
    lines.append("Step time: median of %s time over %d rounds × %d steps per cell, ms; in brackets "
                 "the communication overhead (step − no communication) and its ratio to Gloo's."
                 % (who, args.rounds, args.steps))
    lines.append("")
    lines.append("The floor, from the same run: overheads in ms (ratio to Gloo's overhead).")
    lines.append("")
    lines.append("| ranks | model | batch | %s | %s | %s | %s | floor, DDP routes | floor, DistributedGradients |"
                 % tuple(NAMES[r] for r in FLOOR))
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for n, res in results:
        for c in res["cells"]:
            ms = c["median_ms"]
            gloo = ms["ddp-gloo"] - ms["none"]
            ratio = (lambda v: "%.2f×" % (v / gloo) if gloo > 0 else "n/a")
            fd, fg = floors(ms)
            lines.append("| %d | %s | %d | +%.1f | +%.1f | %.1f | %.1f | %.1f (%s) | %.1f (%s) |" % (
                n, c["model"], c["batch"], ms["ddp-noop"] - ms["none"], ms["sync"] - ms["none"],
                ms["allreduce"], ms["allreduce-plain"], fd, ratio(fd), fg, ratio(fg)))
    lines.append("")
    lines.append("| ranks | model | parameters | weights after the run vs DDP on Gloo: max \\|Δw\\| / max \\|w\\| |")
    lines.append("|---|---|---:|---|")
    for n, res in results:
        for m, d in res["weights"].items():
            lines.append("| %d | %s | %d | %s |" % (n, m, res["params"][m], ", ".join(
                "%s %.1e" % (r, v) for r, v in d.items())))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="rank counts, comma-separated")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--batches", default="32,64", help="per-rank batch sizes")
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds (after one warm-up round)")
    ap.add_argument("--steps", type=int, default=5, help="steps per route per round")
    ap.add_argument("--timing", choices=("slowest", "rank0"), default="slowest",
                    help="slowest: every step starts on all ranks together (a gocoll barrier) and "
                    "takes as long as its slowest rank; rank0: rank 0's own step times, ranks "
                    "running free between routes")
    ap.add_argument("--out", help="write the markdown report here (e.g. build/perf/torch-DATE.md)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    import gocoll._lib as L
    from launch import run_ranks
    lib = next((os.path.realpath(p) for p, _ in L.candidate_paths() if os.sep in p and os.path.exists(p)),
               None)
    if lib is None:
        sys.exit("libgocoll.so not found; build it with build/build.sh or set GOCOLL_LIBRARY")
    env = {"GOCOLL_LIBRARY": lib, "OMP_NUM_THREADS": "1", "GOCOLL_TIMEOUT": "300s"}
    passthrough = ["--worker", "--models", args.models, "--batches", args.batches, "--rounds",
                   args.rounds, "--steps", args.steps, "--timing", args.timing]
    results = []
    cores = os.cpu_count()
    for n in [int(v) for v in args.ranks.split(",")]:
        print("%d ranks on %d cores%s ..." % (n, cores, " (oversubscribed)" if n > cores else ""),
              file=sys.stderr, flush=True)
        res = run_ranks(os.path.abspath(__file__), n, passthrough, env=env, timeout=3600)[0].result
        results.append((n, res))
    head = ["# PyTorch data parallelism: gocoll and Gloo", "",
            "%s, %d cores, torch %s, library %s. `%s`" % (
                datetime.date.today().isoformat(), cores, _torch_version(), lib,
                " ".join(["ddp_bench.py"] + sys.argv[1:])), "", ""]
    report = "\n".join(head) + table(results, args) + "\n"
    print(report)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(report)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"ranks": dict((str(n), r) for n, r in results), "cores": cores}, f, indent=1)


def _torch_version():
    try:
        import torch
        return torch.__version__
    except ImportError:
        return "?"


if __name__ == "__main__":
    main()
