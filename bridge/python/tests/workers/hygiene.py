"""Create/destroy cycles with the process's resources counted (the C twin
is capi/ctest/c/hygiene.c).

Usage: hygiene.py one CYCLES         one-rank communicators
       hygiene.py multi CYCLES DIR   WORLD_SIZE ranks; rank 0 makes a fresh
                                     unique id every cycle and hands it
                                     over in DIR/id-<cycle>

Every cycle joins a communicator, allreduces a few floats in a numpy array
and in gocoll.mem_alloc memory, splits it (colour rank % 2) and allreduces
on the child, destroys the child and then the communicator. Reports the
counts after the warm-up (the first tenth of the cycles, at least 30 or
half) and after the last cycle, once they settled: threads
(/proc/self/task), descriptors (/proc/self/fd), resident memory (VmRSS),
/dev/shm entries (the test gives the ranks a private one where it can) and
descriptors and mappings of gocoll's memory files in this process."""

import gc
import os
import sys
import time

import numpy as np

import gocoll
from common import main, rank_size, report


def memfds():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd).startswith("/memfd:gocoll-"):
                n += 1
        except OSError:
            pass  # the descriptor listing the directory itself
    with open("/proc/self/maps") as f:
        n += sum("/memfd:gocoll-" in line for line in f)
    return n


def usage():
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return {"threads": len(os.listdir("/proc/self/task")), "fds": len(os.listdir("/proc/self/fd")),
            "rss_kib": rss, "shm": len(os.listdir("/dev/shm")), "memfds": memfds()}


def settle(base=None):
    """Measure until the counts stop changing (three equal samples 10 ms
    apart), no memory file is left and, with a baseline, descriptors and
    /dev/shm entries are back at or below it; 10 s at most. (Threads are
    not waited for: the Go runtime keeps idle threads for reuse.)"""
    gc.collect()
    deadline = time.monotonic() + 10
    prev, equal = usage(), 0
    while time.monotonic() < deadline:
        time.sleep(0.01)
        u = usage()
        same = all(u[k] == prev[k] for k in ("threads", "fds", "shm", "memfds"))
        equal = equal + 1 if same else 0
        prev = u
        if equal >= 2 and u["memfds"] == 0 and (
                base is None or (u["fds"] <= base["fds"] and u["shm"] <= base["shm"])):
            break
    return prev


def unique_id(cycle, rank, directory):
    path = os.path.join(directory, "id-%d" % cycle)
    if rank == 0:
        uid = gocoll.get_unique_id()
        with open(path + ".tmp", "wb") as f:
            f.write(uid)
        os.rename(path + ".tmp", path)
        return uid
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "no unique id in %s" % path
        time.sleep(0.001)
    with open(path, "rb") as f:
        return f.read()


def allreduce_check(comm, x, rank, members_sum, what):
    x[:] = rank + 1
    comm.all_reduce(x)
    assert np.all(x == members_sum), "%s: %s, want %d" % (what, x[:4], members_sum)


def cycle(i, rank, size, directory):
    uid = gocoll.get_unique_id() if directory is None else unique_id(i, rank, directory)
    with gocoll.init(rank=rank, size=size, unique_id=uid) as c:
        if directory is not None and rank == 0:
            os.unlink(os.path.join(directory, "id-%d" % i))  # every rank has joined
        total = size * (size + 1) // 2
        allreduce_check(c, np.zeros(16, dtype=np.float32), rank, total, "allreduce")
        block = c.mem_alloc(64)
        mem = block.numpy("float32", 16)
        allreduce_check(c, mem, rank, total, "allreduce in mem_alloc memory")
        del mem, block  # gocollMemFree
        with c.split(rank % 2) as sub:
            allreduce_check(sub, np.zeros(16, dtype=np.float32), rank,
                            sum(r + 1 for r in range(rank % 2, size, 2)), "allreduce on the split")


def work():
    mode, cycles = sys.argv[1], int(sys.argv[2])
    if mode == "one":
        rank, size, directory = 0, 1, None
    else:
        (rank, size), directory = rank_size(), sys.argv[3]
    warm = max(cycles // 10, min(30, cycles // 2))
    start = time.monotonic()
    for i in range(warm):
        cycle(i, rank, size, directory)
    base = settle()
    warm_s = time.monotonic() - start
    for i in range(warm, cycles):
        cycle(i, rank, size, directory)
    end = settle(base)
    report({"warm": dict(base, cycle=warm, seconds=warm_s),
            "end": dict(end, cycle=cycles, seconds=time.monotonic() - start)})


main(work)
