"""Library failures become the right exceptions: mismatched collectives,
a timeout, an abort, and what the peer sees. 2 ranks, GOCOLL_TIMEOUT=3s."""

import time

import numpy as np

import gocoll
from common import expect_raises, main, report


def fresh(world):
    """A new communicator over a unique id made on rank 0 and broadcast over
    ``world`` (the explicit-rendezvous path)."""
    buf = np.zeros(gocoll.UNIQUE_ID_BYTES, dtype=np.uint8)
    if world.rank == 0:
        buf[:] = np.frombuffer(gocoll.get_unique_id(), dtype=np.uint8)
    world.broadcast(buf, src=0)
    return gocoll.init(rank=world.rank, size=world.size, unique_id=buf.tobytes())


def work():
    world = gocoll.init()
    r = world.rank
    c1, c2, c3 = fresh(world), fresh(world), fresh(world)
    out = {}

    # 1. ranks issue different collectives -> InvalidUsage (a RuntimeError) on both
    e = expect_raises(gocoll.InvalidUsage, c1.all_reduce, np.zeros(4 + r, dtype=np.float32))
    assert isinstance(e, RuntimeError) and e.code == 5
    out["mismatch"] = str(e)
    ae = c1.async_error()
    assert isinstance(ae, gocoll.InvalidUsage), ae
    expect_raises(gocoll.InvalidUsage, c1.barrier)  # unusable afterwards
    c1.abort()
    world.barrier()

    # 2. rank 1 does not take part in time -> Timeout (a TimeoutError) on rank 0
    if r == 0:
        t0 = time.monotonic()
        e = expect_raises(gocoll.Timeout, c2.all_reduce, np.ones(10))
        took = time.monotonic() - t0
        assert isinstance(e, TimeoutError) and isinstance(e, gocoll.Error) and e.code == 8
        assert 2.0 < took < 30, took
        out["timeout"] = str(e)
        out["timeout_s"] = took
    else:
        time.sleep(4.0)
        # Rank 0 gave up and told us. The library delivers that notice in
        # stream order, after rank 0's data: the late allreduce itself may
        # still complete (it finds everything it needs), but the next
        # operation must fail with RemoteError.
        try:
            c2.all_reduce(np.ones(10))
            out["late_allreduce"] = "completed"
        except gocoll.Error as e:
            out["late_allreduce"] = "%s: %s" % (type(e).__name__, e)
        e = expect_raises((gocoll.RemoteError, gocoll.InvalidUsage), c2.barrier)
        out["after_peer_timeout"] = "%s: %s" % (type(e).__name__, e)
    c2.abort()
    world.barrier()

    # 3. abort unblocks a pending operation at once; the peer gets RemoteError
    if r == 0:
        w = c3.all_reduce(np.ones(10), async_op=True)
        time.sleep(0.2)
        assert not w.is_completed()
        t0 = time.monotonic()
        c3.abort()
        e = expect_raises(gocoll.Error, w.wait)
        assert time.monotonic() - t0 < 2.0
        out["aborted_wait"] = "%s: %s" % (type(e).__name__, e)
        expect_raises(gocoll.InvalidUsage, c3.barrier, contains="destroyed or aborted")
        world.barrier()
    else:
        world.barrier()  # rank 0 aborted by now
        # The next operation fails with RemoteError, and the ones after it
        # with InvalidUsage ("communicator failed earlier"). (Early builds of
        # the library could still complete the first one from data rank 0
        # had sent before aborting; then the one after is the RemoteError.)
        try:
            c3.all_reduce(np.ones(10))
            out["first_after_abort"] = "completed"
            e = expect_raises(gocoll.RemoteError, c3.barrier)
        except gocoll.RemoteError as first:
            e = first
            out["first_after_abort"] = "RemoteError: %s" % e
            later = expect_raises(gocoll.InvalidUsage, c3.barrier)
            out["later_after_abort"] = str(later)
        assert isinstance(e, ConnectionError)
        out["peer_aborted"] = str(e)
        c3.abort()

    # the world communicator is untouched by all that
    x = np.array([r + 1.0])
    world.all_reduce(x)
    assert x[0] == 3.0
    report(out)


main(work)
