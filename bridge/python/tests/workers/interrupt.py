"""Ctrl-C (SIGINT) during a blocking call that cannot finish (the peer is
not there yet) raises KeyboardInterrupt at once instead of after
GOCOLL_TIMEOUT, aborts the communicator, and the peer learns of it.
2 ranks, GOCOLL_TIMEOUT=60s."""

import os
import signal
import threading
import time

import numpy as np

import gocoll
from gocoll import _interrupt
from common import expect_raises, main, report


def work():
    comm = gocoll.init()
    out = {}
    comm.barrier()
    out["installed"] = _interrupt.installed()
    if comm.rank == 0:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            comm.all_reduce(np.ones(1 << 16, dtype=np.float32))
            out["outcome"] = "completed"
        except KeyboardInterrupt:
            out["outcome"] = "KeyboardInterrupt"
        except gocoll.Error as e:
            out["outcome"] = "%s: %s" % (type(e).__name__, e)
        out["seconds"] = time.monotonic() - t0
        e = expect_raises(gocoll.Error, comm.barrier)
        out["afterwards"] = "%s: %s" % (type(e).__name__, e)
        # A program's own SIGINT handler is left alone: no abort, no error.
        c2 = gocoll.init(rank=0, size=1, unique_id=gocoll.get_unique_id())
        got = []
        old = signal.signal(signal.SIGINT, lambda *a: got.append(1))
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            c2.all_reduce(np.ones(4, dtype=np.float32))
            out["own_handler"] = "ran" if got else "did not run"
        finally:
            signal.signal(signal.SIGINT, old)
        c2.destroy()
    else:
        time.sleep(6.0)  # join long after rank 0 was interrupted
        e = expect_raises(gocoll.Error, comm.all_reduce, np.ones(1 << 16, dtype=np.float32))
        out["peer"] = "%s: %s" % (type(e).__name__, e)
    report(out)
    comm.abort()


main(work)
