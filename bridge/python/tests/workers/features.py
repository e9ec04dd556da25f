"""Asynchronous overlap, buffer lifetime, zero copy, refused inputs, library
argument errors and fork safety. Run with 2 ranks."""

import datetime
import gc
import os
import threading
import time
import tracemalloc

import numpy as np
import torch

import gocoll
import gocoll.torch
from common import expect_raises, main, report


def check_async_overlap(c):
    """Rank 1 joins late: rank 0's non-blocking allreduce is provably still
    running after the call returned, Python threads run while rank 0 blocks
    in wait() (ctypes dropped the GIL), and the result is right."""
    r = c.rank
    x = np.full(1 << 20, r + 1.0, dtype=np.float32)
    c.barrier()
    out = {}
    if r == 1:
        time.sleep(1.0)
        c.all_reduce(x)
    else:
        t0 = time.monotonic()
        w = c.all_reduce(x, async_op=True)
        issue = time.monotonic() - t0
        assert not w.is_completed(), "completed although rank 1 has not joined yet"
        # compute while the collective is pending
        a = torch.randn(200, 200)
        for _ in range(20):
            a = torch.tanh(a @ a) / 10
        assert not w.is_completed()
        counter = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                counter[0] += 1
                time.sleep(0.001)

        t = threading.Thread(target=spin)
        t.start()
        before = counter[0]
        w.wait()
        stop.set()
        t.join()
        assert counter[0] - before > 10, "Python thread did not run while wait() blocked (GIL held?)"
        assert w.is_completed()
        out = {"issue_s": issue, "spins_during_wait": counter[0] - before}
    assert np.all(x == 3.0), x[:4]
    return out


def check_lifetime(c):
    """Buffers of a pending operation stay alive when the caller drops them,
    and even when it drops the Work handle."""
    r = c.rank
    if r == 1:
        time.sleep(0.3)
    w = c.all_reduce(np.full(100000, 2.0, dtype=np.float64), async_op=True)
    gc.collect()
    np.full(100000, -5.0)  # would reuse freed memory
    res = w.wait()
    assert np.all(res == 4.0), res[:3]
    # drop the handle: the communicator keeps it (and its buffers) until done
    c.all_reduce(np.full(1000, 1.0), async_op=True)
    assert c.pending() >= 0
    gc.collect()
    c.barrier()


def check_zero_copy_numpy(c):
    n = 8 << 20  # 32 MiB of float32
    a = np.ones(n, dtype=np.float32)
    ptr = a.ctypes.data
    out = np.empty_like(a)
    tracemalloc.start()
    c.all_reduce(a)
    w = c.all_reduce(a, op="max", async_op=True)
    w.wait()
    c.all_reduce(a, op="sum", out=out)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert a.ctypes.data == ptr
    assert a[0] == 2.0 and a[-1] == 2.0 and out[0] == 4.0
    assert peak < (1 << 20), "allocated %d bytes from Python for a %d-byte allreduce" % (peak, a.nbytes)
    return peak


def check_zero_copy_torch(c):
    """The result lands in the caller's storage, and torch allocates nothing."""
    n = 8 << 20
    t = torch.ones(n)
    ptr = t.data_ptr()
    sptr = t.storage().data_ptr()
    view = t[100:200]  # another tensor on the same storage
    out = torch.empty_like(t)
    # torch's profiler records every allocation of torch's CPU allocator
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        c.all_reduce(t)
        c.all_reduce(t, op="max", async_op=True).wait()
        c.all_reduce(t, out=out)
    allocated = sum(max(e.cpu_memory_usage, 0) for e in prof.events())
    assert allocated < (1 << 20), "torch allocated %d bytes during a %d-byte allreduce" % (allocated, 4 * n)
    assert t.data_ptr() == ptr and t.storage().data_ptr() == sptr
    assert torch.all(view == 2.0) and t[-1] == 2.0 and out[0] == 4.0
    # a view of a larger tensor: the result lands inside it
    big = torch.zeros(10, 1000)
    row = big[3]
    row.fill_(c.rank + 1)
    c.all_reduce(row)
    assert torch.all(big[3] == 3) and torch.all(big[2] == 0) and torch.all(big[4] == 0)
    # bfloat16 and float16 in place
    for dt in (torch.bfloat16, torch.float16):
        h = torch.full((1001,), 1.5, dtype=dt)
        p = h.data_ptr()
        c.all_reduce(h)
        assert h.data_ptr() == p and torch.all(h == 3.0), h[:3]
    # memory from gocollMemAlloc
    m = gocoll.torch.empty(c, (256, 4), torch.float32)
    assert m.data_ptr() % 4096 == 0
    m.fill_(1)
    c.all_reduce(m)
    assert torch.all(m == 2)
    e = c.empty(1000, "float64")
    e[:] = 1.0
    c.all_reduce(e, op="avg")
    assert np.all(e == 1.0)
    return allocated


def check_bad_inputs(c):
    IA, UD = gocoll.InvalidArgument, gocoll.UnsupportedDtype
    a = np.zeros((4, 6), dtype=np.float32)
    ro = np.zeros(8, dtype=np.float32)
    ro.flags.writeable = False
    msgs = {}
    msgs["noncontig numpy"] = expect_raises(ValueError, c.all_reduce, a[:, ::2], contains="contiguous")
    msgs["noncontig torch"] = expect_raises(IA, c.all_reduce, torch.zeros(4, 6).t(), contains="contiguous")
    msgs["read-only"] = expect_raises(IA, c.all_reduce, ro, contains="read-only")
    expect_raises(IA, c.broadcast, ro, src=1 - c.rank, contains="read-only")
    expect_raises(IA, c.all_reduce, np.zeros(8), out=ro, contains="read-only")
    for bad in (np.zeros(3, np.uint16), np.zeros(3, np.complex64),
                np.zeros(3, np.float128) if hasattr(np, "float128") else np.zeros(3, "U1"),
                torch.zeros(3, dtype=torch.complex64)):
        e = expect_raises(UD, c.all_reduce, bad, contains="does not support")
        assert isinstance(e, TypeError) and isinstance(e, ValueError) and isinstance(e, gocoll.Error)
    msgs["dtype"] = str(e)
    expect_raises(IA, c.all_reduce, np.zeros(3, ">f4"), contains="byte order")
    expect_raises(IA, c.all_reduce, torch._neg_view(torch.zeros(3)), contains="negation")
    expect_raises(IA, c.all_reduce, torch.zeros(3).to_sparse(), contains="layout")
    expect_raises(TypeError, c.all_reduce, [1.0, 2.0], contains="numpy.ndarray")
    # wrong sizes / kinds
    msgs["out size"] = expect_raises(IA, c.all_reduce, np.zeros(8, np.float32), out=np.zeros(7, np.float32),
                                     contains="elements")
    expect_raises(IA, c.all_reduce, np.zeros(8, np.float32), out=np.zeros(8, np.float64), contains="dtype")
    expect_raises(IA, c.all_gather_into_tensor, np.zeros(8, np.float32), np.zeros(8, np.float32),
                  contains="elements")
    expect_raises(IA, c.all_gather, [np.zeros(8, np.float32)] * 2, np.zeros(7, np.float32),
                  contains="elements")
    expect_raises(IA, c.all_gather, [np.zeros(8, np.float32)] * 3, np.zeros(8, np.float32),
                  contains="one per rank")
    expect_raises(IA, c.all_gather, [np.zeros(8, np.float64)] * 2, np.zeros(8, np.float32),
                  contains="dtype")
    expect_raises(IA, c.reduce_scatter_tensor, None, np.zeros(7, np.float32), contains="multiple")
    expect_raises(IA, c.reduce_scatter, np.zeros(4, np.float32), [np.zeros(3, np.float32)] * 2,
                  contains="elements")
    expect_raises(IA, c.all_to_all_single, None, np.zeros(7, np.float32), contains="divisible")
    expect_raises(IA, c.all_to_all_single, np.zeros(4), np.zeros(4), [1, 1], [2, 3], contains="split")
    expect_raises(IA, c.send, np.zeros(3), 1 - c.rank, tag=-1, contains="tag")
    expect_raises(IA, c.recv, np.zeros(3), 1 - c.rank, tag=2 ** 31 - 1, contains="reserved")
    expect_raises(IA, c.alltoallv, np.zeros(8), [1, 1, 1], [1, 1], contains="one per rank")
    expect_raises(IA, c.alltoallv, np.zeros(2), [4, 4], [4, 4], contains="send blocks")
    expect_raises(IA, c.alltoallv, np.zeros(8), [4, 4], [4, 4], out=np.zeros(3), contains="receive blocks")
    expect_raises(IA, c.alltoallv, np.zeros(8), [4, -4], [4, 4], contains="negative")
    expect_raises(IA, c.send, np.zeros(3), 5, contains="outside")
    # Integers only, and only what a C int holds; the message names the argument.
    msgs["split str"] = expect_raises(IA, c.split, "x", contains="split: color")
    expect_raises(IA, c.split, 0, key="k", contains="split: key")
    expect_raises(IA, c.split, 1 << 31, contains="C int")
    expect_raises(IA, c.send, np.zeros(3), "1", contains="dst")
    expect_raises(IA, c.recv, np.zeros(3), 1.0, contains="src")
    expect_raises(IA, c.send, np.zeros(3), 1 << 40, contains="C int")
    expect_raises(IA, c.broadcast, np.zeros(3), src="0", contains="src")
    expect_raises(IA, gocoll.init, rank="0", size=2, unique_id=b"\0" * 128, contains="rank")
    expect_raises(IA, c.mem_alloc, "8", contains="mem_alloc")
    expect_raises(IA, c.alltoallv, np.zeros(8), ["4", 4], [4, 4], contains="integers")
    expect_raises(IA, c.broadcast, np.zeros(3), src=-1, contains="outside")
    msgs["op"] = expect_raises(IA, c.all_reduce, np.zeros(3), op="median", contains="unknown reduction")
    expect_raises(IA, gocoll.init, rank=0, size=2)
    expect_raises(IA, gocoll.init, rank=0, size=2, unique_id=b"short")
    # errors found by the library itself: overlapping buffers, send to self
    buf = np.zeros(20, dtype=np.float32)
    e = expect_raises(IA, c.all_reduce, buf[0:10], out=buf[5:15])
    assert e.code == 4 and isinstance(e, ValueError) and str(e) and e.reason, (e, e.reason)
    msgs["library overlap"] = e
    e = expect_raises(gocoll.InvalidUsage, c.send, np.zeros(3), c.rank)
    msgs["library send to self"] = e
    # still usable after argument errors
    x = np.ones(4)
    c.all_reduce(x)
    assert np.all(x == 2)
    assert c.async_error() is None
    return {k: str(v) for k, v in msgs.items()}


def check_work_api(c):
    """gocoll.Work as torch's Work: wait(timeout) gives up while the
    operation cannot finish (rank 1 sends only once rank 0's timed wait
    returned), the operation goes on and completes; is_success;
    get_future with the output and with an error."""
    r = c.rank
    out = {}
    if r == 0:
        y = np.zeros(4, np.float32)
        w = c.irecv(y, 1, tag=9)
        e = expect_raises(gocoll.Timeout, w.wait, 0.2, contains="still pending")
        out["wait_timeout"] = str(e)
        assert not w.is_completed()
        expect_raises(RuntimeError, w.is_success, contains="before")
        go = c.isend(np.ones(1, np.float32), 1, tag=1)
        assert w.wait(datetime.timedelta(minutes=1)) is y and np.all(y == 7), y
        assert w.is_completed() and w.is_success() and w.exception() is None
        go.wait()
    else:
        c.recv(np.zeros(1, np.float32), 0, tag=1)
        c.send(np.full(4, 7, np.float32), 0, tag=9)
    t = torch.full((3,), float(r + 1))
    got = c.all_reduce(t, async_op=True).get_future().wait()
    assert isinstance(got, list) and got[0] is t and torch.all(t == 3), got
    assert c.barrier(async_op=True).get_future().wait() == []
    # A future's callback that issues an operation and waits for its
    # future (torch's PowerSGD hook does): the waiter thread runs the
    # callback, so the inner future must complete without it.
    u = torch.ones(2)

    def inner(_):
        return c.all_reduce(u, async_op=True).get_future().wait()[0] * 10
    chained = c.all_reduce(torch.ones(1), async_op=True).get_future().then(inner)
    assert torch.equal(chained.wait(), torch.full((2,), 20.0)), chained.wait()
    # An error through the future: a real error carrying gocoll's message
    # (on a communicator of its own, which the mismatch ends).
    sub = c.split(0)
    fut = sub.all_reduce(np.zeros(4 + r, np.float32), async_op=True).get_future()
    e = expect_raises(RuntimeError, fut.wait, contains="mismatch")
    out["future_error"] = str(e)
    sub.abort()
    return out


def check_fork(c):
    """A child forked after the library was loaded gets a clear error
    instead of touching the Go runtime."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            c.barrier()
        except RuntimeError as e:
            code = 0 if "spawn" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def check_topology(c):
    """comm.topology(): this rank, every rank on some host, the graph's
    links, and what this machine is made of."""
    t = c.topology()
    assert t["rank"] == c.rank and t["ranks"] == c.size, t
    assert sorted(r for h in t["hosts"] for r in h["ranks"]) == list(range(c.size)), t["hosts"]
    assert sorted(t["ring"]) == list(range(c.size)), t["ring"]
    assert t["graph"]["links"] and all(l["bandwidth"] > 0 for l in t["graph"]["links"]), t["graph"]
    assert t.get("local_host", {}).get("cores", 0) >= 1 or "detect_error" in t, t
    return {"hosts": len(t["hosts"]), "source": t.get("local_source")}


def work():
    c = gocoll.init()
    res = {}
    res["topology"] = check_topology(c)
    res["overlap"] = check_async_overlap(c)
    check_lifetime(c)
    res["work"] = check_work_api(c)
    res["tracemalloc_peak"] = check_zero_copy_numpy(c)
    res["torch_allocated"] = check_zero_copy_torch(c)
    res["messages"] = check_bad_inputs(c)
    check_fork(c)
    c.barrier()
    c.destroy()
    expect_raises(gocoll.InvalidUsage, c.barrier, contains="destroyed")
    c.destroy()  # idempotent
    report(res)


main(work)
