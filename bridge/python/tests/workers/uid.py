"""The explicit rendezvous: rank 0 makes a unique id and passes it through a
file; every rank joins with init(rank=, size=, unique_id=). Then it exits
with a communicator still alive and an operation never waited for: the
atexit handler must finish both and the process must exit cleanly.
Usage: uid.py ID_FILE"""

import os
import sys
import time

import numpy as np

import gocoll
from common import main, rank_size, report


def work():
    path = sys.argv[1]
    rank, size = rank_size()
    # this path must not need the launcher variables
    for k in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(k, None)
    if rank == 0:
        uid = gocoll.get_unique_id()
        assert isinstance(uid, bytes) and len(uid) == 128
        with open(path + ".tmp", "wb") as f:
            f.write(uid)
        os.rename(path + ".tmp", path)
    else:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            assert time.monotonic() < deadline, "no unique id file"
            time.sleep(0.02)
        with open(path, "rb") as f:
            uid = f.read()
    with gocoll.init(rank=rank, size=size, unique_id=uid) as c:
        assert (c.rank, c.size) == (rank, size)
        x = np.full(5, rank, dtype=np.int32)
        c.all_reduce(x)
        assert np.all(x == sum(range(size))), x
    assert c.closed
    # leave a communicator and a non-blocking operation to the atexit handler
    # (a unique id serves one job: make another one, passed as a hex string)
    buf = np.zeros(gocoll.UNIQUE_ID_BYTES, dtype=np.uint8)
    if rank == 0:
        buf[:] = np.frombuffer(gocoll.get_unique_id(), dtype=np.uint8)
        with open(path + ".2.tmp", "wb") as f:
            f.write(buf.tobytes())
        os.rename(path + ".2.tmp", path + ".2")
    else:
        while not os.path.exists(path + ".2"):
            time.sleep(0.02)
        buf[:] = np.frombuffer(open(path + ".2", "rb").read(), dtype=np.uint8)
    world = gocoll.init(rank=rank, size=size, unique_id=buf.tobytes().hex())
    world.all_reduce(np.ones(1000), async_op=True)  # handle dropped on purpose
    report({"version": gocoll.version(), "library": gocoll.library_path(), "pending": world.pending()})


main(work)
