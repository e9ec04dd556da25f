"""The PyTorch routes' failure paths, on 2 ranks. Usage: hook_route.py MODE

  errors          an error inside gocoll's DDP comm hook (the peer's
                  communicator aborted) reaches DDP as gocoll's error on both
                  ranks, not "Unable to cast"; so does an error through
                  Work.get_future() in a hook of one's own; a sparse gradient
                  in DistributedGradients gets its own message
  sigint-hook     Ctrl-C while DDP (gloo + gocoll's hook) waits in C++ for a
                  peer that does not come: KeyboardInterrupt, the peer learns
  sigint-backend  the same with DDP on the "gocoll" backend

Every job ends by itself; a hang is the test's deadline (shorter than
GOCOLL_TIMEOUT)."""

import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

import gocoll
import gocoll.torch as gt
from common import expect_raises, hard_exit, main, rank_size, report

BEFORE = 3  # steps both ranks take before rank 1 stays away (DDP rebuilt its buckets by then)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))


def step(ddp, r, i):
    g = torch.Generator().manual_seed(10 * i + r)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    ddp.zero_grad()
    ((ddp(x) - y) ** 2).mean().backward()


def errors(r):
    out = {}
    dist.init_process_group("gloo")
    comm = gocoll.init()  # MASTER_PORT + 1
    ddp = nn.parallel.DistributedDataParallel(model())
    ddp.register_comm_hook(comm, gt.allreduce_hook)
    step(ddp, r, 0)
    if r == 1:
        comm.abort()  # rank 1's hook now fails at the call, rank 0's in flight
    e = expect_raises(RuntimeError, step, ddp, r, 1)
    out["hook"] = str(e)
    assert "Unable to cast" not in str(e) and "gocoll" in str(e), e

    # A hook of one's own over Work.get_future(): a mismatch (rank 1's
    # buckets are larger) fails both ranks with gocoll's error.
    c2 = gocoll.init(rank=r, size=2, unique_id=shared_uid(r))

    def hook(state, bucket):
        buf = bucket.buffer()
        if r == 1:
            buf = torch.cat([buf, buf[:1]])
        return c2.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp = nn.parallel.DistributedDataParallel(model())
    ddp.register_comm_hook(None, hook)
    e = expect_raises(RuntimeError, step, ddp, r, 2)
    out["get_future"] = str(e)
    assert "Unable to cast" not in str(e) and "mismatch" in str(e), e

    # DistributedGradients on a sparse gradient: its own message first.
    c3 = gocoll.init(rank=r, size=2, unique_id=shared_uid(r, "2"))
    emb = nn.Embedding(10, 4, sparse=True)
    gt.DistributedGradients(emb, c3)
    e = expect_raises(Exception, lambda: emb(torch.tensor([1, 2])).sum().backward())
    out["sparse"] = str(e)
    assert "sparse gradients are not supported" in str(e), e
    report(out)


def shared_uid(r, name="1"):
    """A fresh unique id from rank 0, through the default group's store."""
    store = dist.distributed_c10d._get_default_store()
    key = "test/uid" + name
    if r == 0:
        store.set(key, gocoll.get_unique_id())
    else:
        store.wait([key])
    return bytes(store.get(key))


def interrupt_when_blocked(main_tid, ready):
    """Once ``ready`` (the step issued its last allreduce), wait until the
    main thread sleeps for 20 polls in a row (DDP waiting in C++ for the
    futures) and send SIGINT."""
    deadline = time.monotonic() + 60
    ready.wait(60)
    asleep = 0
    while asleep < 20 and time.monotonic() < deadline:
        with open("/proc/self/task/%d/stat" % main_tid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        asleep = asleep + 1 if state == "S" else 0
        time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGINT)


def sigint(r, backend):
    out = {}
    dist.init_process_group("gocoll" if backend else "gloo")
    store = dist.distributed_c10d._get_default_store()
    ddp = nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.001)  # several buckets
    ready = threading.Event()
    if backend:
        # DDP's own allreduce through the backend's works
        comm = dist.distributed_c10d._get_default_group().comm
        ready.set()
    else:
        comm = gocoll.init()
        count = {"calls": 0, "buckets": None}

        def hook(state, bucket):
            fut = gt.allreduce_hook(state, bucket)
            count["calls"] += 1
            if count["calls"] == count["buckets"]:
                ready.set()  # the step's last bucket
            return fut
        ddp.register_comm_hook(comm, hook)
    for i in range(BEFORE):
        step(ddp, r, i)
    if not backend:
        count["buckets"], count["calls"] = count["calls"] // BEFORE, 0
        out["buckets"] = count["buckets"]
    if r == 0:
        threading.Thread(target=interrupt_when_blocked, args=(threading.get_native_id(), ready),
                         daemon=True).start()
        # DDP waits in C++, which turns every error into a RuntimeError: the
        # step fails with gocoll's "interrupted", and Python raises the
        # KeyboardInterrupt at its next bytecode (here or in the handler).
        try:
            try:
                step(ddp, r, BEFORE)
                out["outcome"] = "completed"
            except Exception as e:
                out["step_error"] = str(e)
                for _ in range(100):
                    pass
                out["outcome"] = "no KeyboardInterrupt"
        except KeyboardInterrupt:
            out["outcome"] = "KeyboardInterrupt"
        store.set("test/interrupted", "1")
        store.wait(["test/peer-done"])  # rank 0 serves the store: stay until rank 1 read it
    else:
        store.wait(["test/interrupted"])
        e = expect_raises(gocoll.Error, comm.barrier)
        out["peer"] = "%s: %s" % (type(e).__name__, e)
        store.set("test/peer-done", "1")
    report(out)
    hard_exit(0)  # the aborted communicator and gloo's group need no goodbye


MODES = {
    "errors": errors,
    "sigint-hook": lambda r: sigint(r, backend=False),
    "sigint-backend": lambda r: sigint(r, backend=True),
}


def run():
    MODES[sys.argv[1]](rank_size()[0])


if __name__ == "__main__":
    main(run)
