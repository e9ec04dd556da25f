"""A torch model trained on virtual devices that survives a killed rank.

    /usr/bin/python3 bridge/python/examples/train_elastic.py -np 4 -virtual 8 [--respawn]
    # in another terminal, while it trains: kill -9 <a pid it printed>

The script launches its own ranks (fresh interpreters, never forked). Each
rank hosts some of the -virtual devices; every device computes the gradient
of its shard of each global batch, the virtual allreduce averages them in
device order, and the shared parameters and momentum are updated alike on
every rank (gocoll.elastic.State). When a rank process dies the launcher
reports it and the others go on: they shrink the communicator, take over its
devices with the state of a live holder, settle the step in flight and
continue. With --respawn the launcher starts a replacement process, which
joins at a step boundary and takes devices back. The last lines are ``weights sha256 <hex>`` of the final
state_dict (the same with or without the kill, and on any -np) and the
test loss.

Per-device data and randomness depend only on (seed, device, step), and
torch runs one thread, so a device computes the same bits on any process.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

D_IN, D_H, D_OUT = 32, 64, 8


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=4, help="rank processes")
    p.add_argument("-virtual", type=int, default=8, help="virtual devices")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64, help="global batch, split over the devices")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--min-ranks", type=int, default=1, help="fewest processes to go on with")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--respawn", action="store_true", help="start a replacement for each killed rank; it joins")
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.np < 1 or a.virtual < 1 or a.batch % a.virtual:
        p.error("-np and -virtual must be positive and --batch a multiple of -virtual")
    return a


# -- one rank ---------------------------------------------------------------

def rank_main(a):
    import numpy as np
    import torch
    from torch import nn

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import gocoll
    import gocoll.elastic

    torch.set_num_threads(1)  # the same bits on any process: no thread-count-dependent sums
    torch.manual_seed(a.seed)
    model = nn.Sequential(nn.Linear(D_IN, D_H), nn.Tanh(), nn.Linear(D_H, D_OUT))
    teacher = nn.Sequential(nn.Linear(D_IN, D_H), nn.Tanh(), nn.Linear(D_H, D_OUT))
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    flat = np.concatenate([p.detach().numpy().ravel() for p in params]).astype(np.float32)
    momentum = np.zeros_like(flat)
    # The model's parameters are views of the registered shared buffer:
    # the recovery's copy into it is the model's state.
    off = 0
    for p, n in zip(params, sizes):
        p.data = torch.from_numpy(flat[off:off + n]).view_as(p)
        off += n

    def batch(dev, step):
        g = torch.Generator().manual_seed(a.seed * 1_000_003 + dev * 10_007 + step)
        x = torch.randn(a.batch // a.virtual, D_IN, generator=g)
        with torch.no_grad():
            y = teacher(x)
        return x, y

    job = os.environ.get("TRAIN_ELASTIC_JOB")
    if os.environ.get("TRAIN_ELASTIC_REPLACES"):
        state = gocoll.elastic.State.join(job, a.virtual, min_ranks=a.min_ranks,
                                          replaces=os.environ["TRAIN_ELASTIC_REPLACES"], params=flat, momentum=momentum)
        print("joined at step %d as rank %d of %d" % (state.step, state.comm.rank, state.comm.size), flush=True)
    else:
        comm = gocoll.init()
        state = gocoll.elastic.State(comm, a.virtual, min_ranks=a.min_ranks, job_file=job, params=flat,
                                     momentum=momentum)
    grads = {}

    @gocoll.elastic.run
    def train(state):
        while state.step < a.steps:
            bufs = []
            for dev in state.devices:
                x, y = batch(dev, state.step)
                model.zero_grad(set_to_none=False)
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                buf = grads.setdefault(dev, np.empty(flat.size + 1, np.float32))
                torch.cat([p.grad.ravel() for p in params], out=torch.from_numpy(buf[:-1]))
                buf[-1] = loss.item()
                bufs.append(buf)
            state.vcomm.allreduce(bufs, op="avg")
            avg = bufs[0]
            state.momentum *= 0.9
            state.momentum += avg[:-1]
            state.params -= a.lr * state.momentum
            size = state.comm.size
            state.commit()
            if state.comm.size != size and state.comm.rank == 0:
                print("step %d: admitted %d process(es); %d go on" % (state.step, state.comm.size - size,
                                                                      state.comm.size), flush=True)
            if state.comm.rank == 0 and state.step % a.log_every == 0:
                print("step %d loss %.5f" % (state.step, avg[-1]), flush=True)

    train(state)
    for r in state.recoveries:
        if state.comm.rank == 0:
            print("step %d: lost rank(s) %s; %d processes went on from step %d after %.1f ms" % (
                r["step"], r["lost"], r["ranks"], r["resumed"], 1e3 * r["seconds"]), flush=True)
    sd = model.state_dict()
    h = hashlib.sha256()
    for k in sd:
        h.update(sd[k].detach().contiguous().numpy().tobytes())
    x, y = batch(a.virtual, 10 ** 9)  # held out: a device number no device has
    with torch.no_grad():
        test = nn.functional.mse_loss(model(x), y).item()
    if state.comm.rank == 0 and a.result:
        with open(a.result, "w") as f:
            json.dump({"sha256": h.hexdigest(), "test_loss": test, "ranks": state.comm.size,
                       "recoveries": state.recoveries}, f)
    state.close()
    state.comm.destroy()


# -- the launcher -------------------------------------------------------------

def root_port():
    """A free port for the rendezvous root, outside the kernel's ephemeral
    range: a port from that range, free now, may be handed to an outgoing
    connection (of these ranks, dialling a root not listening yet, or of
    anything else) before rank 0 binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    ranges = [(a, b) for a, b in ((10000, lo - 1), (hi + 1, 65535)) if b - a > 100] or [(lo, hi)]
    for _ in range(200):
        port = random.randrange(*random.choice(ranges))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    sys.exit("train_elastic: no free port for the rendezvous root")


def launch(a):
    port = root_port()
    tmp = tempfile.mkdtemp(prefix="train-elastic-")
    try:
        run_job(a, port, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_job(a, port, tmp):
    result = os.path.join(tmp, "result.json")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"GOCOLL_SIZE": str(a.np), "GOCOLL_ROOT_ADDR": "127.0.0.1:%d" % port, "OMP_NUM_THREADS": "1"})
    argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + ["--result", result]
    if a.respawn:
        env["TRAIN_ELASTIC_JOB"] = os.path.join(tmp, "job")
        env.setdefault("GOCOLL_SECRET", os.urandom(16).hex())  # a joiner needs the job's secret
    procs, members = [], set()
    for r in range(a.np):
        e = dict(env, GOCOLL_RANK=str(r), GOCOLL_LOCAL_RANK=str(r))
        procs.append(subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL))
        members.add(r)
        print("train_elastic: rank %d is pid %d" % (r, procs[-1].pid), file=sys.stderr, flush=True)
    failed, live, done_at = [], set(range(a.np)), None
    while live:
        time.sleep(0.01)
        for r in sorted(live):
            rc = procs[r].poll()
            if rc is None:
                continue
            live.discard(r)
            what = "rank %d" % r if r in members else "replacement %d" % (r - a.np)
            if rc < 0:
                print("train_elastic: %s died (%s); the job goes on without it" % (what, signal.Signals(-rc).name),
                      file=sys.stderr, flush=True)
                if a.respawn and r in members and live & members:
                    e = {k: v for k, v in env.items() if k not in ("GOCOLL_SIZE", "GOCOLL_ROOT_ADDR")}
                    e["TRAIN_ELASTIC_REPLACES"] = str(procs[r].pid)
                    procs.append(subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL))
                    live.add(len(procs) - 1)
                    print("train_elastic: replacement %d for rank %d is pid %d" % (
                        len(procs) - 1 - a.np, r, procs[-1].pid), file=sys.stderr, flush=True)
            elif rc != 0 and r in members:
                failed.append(r)
            elif rc != 0:
                print("train_elastic: %s failed (exit %d)" % (what, rc), file=sys.stderr, flush=True)
        # Once the members are done, a replacement still waiting to join
        # will not be admitted: give it a moment, then stop it.
        if not live & members and live:
            done_at = done_at or time.monotonic()
            if time.monotonic() - done_at > 5:
                for r in live:
                    procs[r].kill()
    if failed or not os.path.exists(result):
        sys.exit("train_elastic: rank(s) %s failed" % failed)
    with open(result) as f:
        res = json.load(f)
    print("weights sha256 %s" % res["sha256"])
    print("test loss: %.6f" % res["test_loss"])


if __name__ == "__main__":
    args = parse()
    if os.environ.get("GOCOLL_RANK") is not None or os.environ.get("TRAIN_ELASTIC_REPLACES"):
        rank_main(args)
    else:
        launch(args)
