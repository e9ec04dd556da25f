"""Surviving a lost rank from Python: 4 ranks allreduce (checked); rank
VICTIM SIGKILLs itself mid-loop; the others catch the peer failure, shrink
to 3 (agreed failed set), check more sums, then admit a replacement
process (ROLE=join: gocoll.join with GOCOLL_SECRET) and check sums as 4.
Bad input on the way: out-of-range and duplicate exclude lists, a revoked
communicator's calls."""

import os
import signal
import time

import numpy as np

import gocoll
from common import expect_raises, main, report

N = 1024


def checked(comm, step, extra=0.0):
    """One allreduce of step's values; extra travels in the last element."""
    n = comm.size
    base = ((step + np.arange(N)) % 7 + 1).astype(np.float32)
    buf = np.empty(N + 1, dtype=np.float32)
    buf[:N] = (comm.rank + 1) * base
    buf[N] = extra
    comm.all_reduce(buf)
    want = n * (n + 1) / 2 * base
    if not np.array_equal(buf[:N], want):
        raise AssertionError("step %d on rank %d of %d: wrong sums" % (step, comm.rank, n))
    return float(buf[N])


def join_role():
    path = os.environ["JOIN_FILE"]
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError("no join file")
        time.sleep(0.01)
    with open(path) as f:
        info = f.read()
    c = gocoll.join(info)
    for step in range(20):
        checked(c, step)
    report({"role": "joiner", "rank": c.rank, "size": c.size})
    c.destroy()


def work():
    if os.environ.get("ROLE") == "join":
        return join_role()
    victim = int(os.environ["VICTIM"])
    world = gocoll.init()
    r = world.rank
    out = {}
    e = expect_raises(gocoll.InvalidArgument, world.shrink, [world.size])
    assert "out of range" in str(e)
    expect_raises(gocoll.InvalidArgument, world.shrink, [(r + 1) % 4, (r + 1) % 4], contains="twice")
    step = 0
    t_fail = None
    try:
        while True:
            checked(world, step)
            step += 1
            if step == 20 and r == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            if step > 100000:
                raise AssertionError("no failure")
    except gocoll.PEER_FAILURES as e:
        t_fail = time.monotonic()
        out["error"] = "%s: %s" % (type(e).__name__, e)
    small = world.shrink()
    out["shrink_ms"] = (time.monotonic() - t_fail) * 1e3
    out["size"], out["rank"], out["failed"] = small.size, small.rank, world.failed()
    expect_raises(gocoll.Revoked, world.barrier)
    for s in range(10):
        checked(small, s)
    if small.rank == 0:
        tmp = os.environ["JOIN_FILE"] + ".tmp"
        with open(tmp, "w") as f:
            f.write(small.join_info())
        os.rename(tmp, os.environ["JOIN_FILE"])
    s = 10
    deadline = time.monotonic() + 60
    while True:
        if time.monotonic() > deadline:
            raise AssertionError("no process joined")
        waiting = small.joiners() if small.rank == 0 else 0
        total = checked(small, s, waiting)
        s += 1
        if total > 0:
            grown = small.grow(int(total))
            break
    for step in range(20):
        checked(grown, step)
    out["grown"] = grown.size
    report(out)
    grown.destroy()
    small.destroy()
    world.destroy()


if __name__ == "__main__":
    main(work)
