"""Communicators over the C ABI (gocoll.h): joining, lifetime, surviving a
lost rank, memory, and the one call path (``Comm._run``).

The operations live beside it, one module per concern, mixed into
:class:`Comm`: ``_collectives`` (reductions, broadcast, gathers),
``_alltoall`` (the all-to-all family and split sizes), ``_p2p`` (sends,
receives, barriers); ``_work`` holds :class:`Work`, ``_args`` the argument
conversions. Everything importable from here before stays importable.
"""

import atexit
import ctypes
import datetime
import json
import math
import numbers
import threading

from . import _buffer, _interrupt, _lib, errors
# ReduceOp, DataType, MONITOR_TAG, _op, _timeout_ms, _check_call and Work are
# re-exported: gocoll, gocoll.vppu and users import them from here.
from ._args import (MONITOR_TAG, _INT_MAX, DataType, ReduceOp, _c_int, _c_size,  # noqa: F401
                    _check_call, _error, _op, _timeout_ms)
from ._alltoall import AllToAll
from ._buffer import as_buffer
from ._collectives import Collectives
from ._p2p import PointToPoint
from ._work import Work, _Waiter


def version():
    """The loaded library's version code (major*10000 + minor*100 + patch)."""
    lib = _lib.load()
    v = ctypes.c_int()
    _check_call(lib.gocollGetVersion(ctypes.byref(v)), "gocollGetVersion")
    return v.value


def get_unique_id():
    """Create the rendezvous of a new job (128 bytes) and start serving it in
    this process; give the bytes to every rank's ``init(rank=, size=,
    unique_id=)``. The process that made it must stay alive until every rank
    joined (it is usually rank 0). Treat the bytes like a password: they
    carry the secret that authenticates the job's connections."""
    lib = _lib.load()
    uid = _lib.UniqueId()
    _check_call(lib.gocollGetUniqueId(ctypes.byref(uid)), "gocollGetUniqueId")
    return ctypes.string_at(ctypes.addressof(uid), _lib.UNIQUE_ID_BYTES)


def init(rank=None, size=None, unique_id=None, *, timeout=None, algo=None, debug=None):
    """Join a job and return its :class:`Comm`.

    - ``gocoll.init()``: from the launcher's environment (torchrun: RANK,
      WORLD_SIZE, MASTER_ADDR, MASTER_PORT — gocoll's rendezvous uses
      MASTER_PORT+1 or GOCOLL_PORT; Open MPI; Slurm; GOCOLL_RANK/SIZE/ROOT_ADDR).
    - ``gocoll.init(rank=r, size=n, unique_id=uid)``: uid from
      :func:`get_unique_id` on one process.

    Settings of this communicator's own (a gocollConfig_t), each winning over
    its GOCOLL_* variable for this communicator only:

    - ``timeout``: seconds (int or float) or a ``datetime.timedelta``; every
      wait of the communicator (GOCOLL_TIMEOUT);
    - ``algo``: algorithm choice in GOCOLL_ALGO's syntax, e.g.
      ``"allreduce=ring,alltoall=bruck"``;
    - ``debug``: log level, as GOCOLL_DEBUG (``"INFO"``, ``"OFF"``, …).

    Unset (None), the variable applies, then the default. Collective:
    returns once every rank joined. The other GOCOLL_* settings are read
    from the environment here (each one: docs/settings.md).
    """
    lib = _lib.load()
    h = _lib.Comm()
    config = _config(timeout, algo, debug)
    if rank is None and size is None and unique_id is None:
        if config is None:
            _check_call(lib.gocollCommInitFromEnv(ctypes.byref(h)), "gocollCommInitFromEnv")
        else:
            _check_call(lib.gocollCommInitFromEnvConfig(ctypes.byref(h), ctypes.byref(config)),
                        "gocollCommInitFromEnvConfig")
    else:
        if rank is None or size is None or unique_id is None:
            raise errors.InvalidArgument(
                "gocoll.init: pass rank, size and unique_id together (or none of them, to "
                "read the launcher's environment)")
        uid = _unique_id(unique_id)
        size, rank = _c_int(size, "init: size"), _c_int(rank, "init: rank")
        if config is None:
            _check_call(lib.gocollCommInitRank(ctypes.byref(h), size, uid, rank),
                        "gocollCommInitRank")
        else:
            _check_call(lib.gocollCommInitRankConfig(ctypes.byref(h), size, uid, rank,
                                                      ctypes.byref(config)),
                        "gocollCommInitRankConfig")
    return Comm._adopt(lib, h.value)


def _config(timeout, algo, debug):
    """A gocollConfig_t for init's settings, or None when none is given (the
    calls without a config then serve, as they do with older libraries)."""
    if timeout is None and algo is None and debug is None:
        return None
    config = _lib.Config()
    if timeout is not None:
        config.timeoutMs = _config_timeout_ms(timeout)
    for name, value in (("algo", algo), ("debug", debug)):
        if value is None:
            continue
        if not isinstance(value, str):
            raise errors.InvalidArgument("gocoll.init: %s must be a string, got %r" % (name, value))
        setattr(config, name, value.encode())
    return config


def _config_timeout_ms(timeout):
    """``timeout`` (seconds, or a timedelta) in whole milliseconds for
    gocollConfig_t.timeoutMs, or InvalidArgument."""
    if isinstance(timeout, datetime.timedelta):
        secs = timeout.total_seconds()
    elif isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        secs = float(timeout)
    else:
        raise errors.InvalidArgument("gocoll.init: timeout must be seconds or a datetime.timedelta, "
                                     "got %r" % (timeout,))
    ms = math.ceil(secs * 1000) if math.isfinite(secs) else 0  # NaN, inf: refused below
    if not 1 <= ms <= _INT_MAX:
        raise errors.InvalidArgument("gocoll.init: timeout %r: want more than 0 and at most %d ms "
                                     "(24.8 days)" % (timeout, _INT_MAX))
    return ms


def _unique_id(unique_id):
    if isinstance(unique_id, _lib.UniqueId):
        return unique_id
    if isinstance(unique_id, str):
        try:
            unique_id = bytes.fromhex(unique_id)
        except ValueError:
            raise errors.InvalidArgument("gocoll: unique_id string must be hex") from None
    b = bytes(unique_id)
    if len(b) != _lib.UNIQUE_ID_BYTES:
        raise errors.InvalidArgument(
            "gocoll: unique_id must be %d bytes (from gocoll.get_unique_id()), got %d"
            % (_lib.UNIQUE_ID_BYTES, len(b)))
    uid = _lib.UniqueId()
    ctypes.memmove(ctypes.addressof(uid), b, len(b))
    return uid


# ---------------------------------------------------------------------------
# Live communicators, destroyed at interpreter exit.

_live = {}  # handle -> Comm
_live_lock = threading.Lock()
_atexit_registered = False


def _register(comm):
    global _atexit_registered
    with _live_lock:
        _live[comm._h] = comm
        if not _atexit_registered:
            atexit.register(_destroy_all)
            _atexit_registered = True


def _destroy_all():
    """atexit: destroy every communicator still alive (children first)."""
    if _lib.forked():
        return
    with _live_lock:
        comms = list(_live.values())
    for c in reversed(comms):
        try:
            c.destroy()
        except Exception:  # exiting anyway; a failed peer must not hide the real exit status
            pass


_lib_SHRINK_ABORT = 1  # GOCOLL_SHRINK_ABORT


def join(info, unique_id=None, *, timeout=None):
    """Join a running communicator as a new rank (gocollCommJoin): ``info``
    is its :meth:`Comm.join_info`; the job's secret comes from ``unique_id``
    (the bytes of :func:`get_unique_id` the job started with) or, when None,
    from GOCOLL_SECRET. Returns once the members admitted this process
    (:meth:`Comm.grow`), or raises Timeout."""
    lib = _lib.load()
    h = _lib.Comm()
    if not isinstance(info, (str, bytes)):
        raise errors.InvalidArgument("gocoll.join: info must be a string, got %r" % (info,))
    raw = info.encode() if isinstance(info, str) else info
    uid = None if unique_id is None else ctypes.byref(_unique_id(unique_id))
    config = _config(timeout, None, None)
    _check_call(lib.gocollCommJoin(ctypes.byref(h), raw, uid,
                                   None if config is None else ctypes.byref(config)), "gocollCommJoin")
    return Comm._adopt(lib, h.value)


class Comm(Collectives, AllToAll, PointToPoint):
    """One rank's membership in a group; made by :func:`init` or :meth:`split`.

    Methods have torch.distributed's names, argument order (output first)
    and keywords (``src``, ``dst``, ``tag``, ``async_op``). Collectives take
    numpy arrays or torch CPU tensors and pass their memory to the library
    without copying (the list forms go through a staging buffer). Blocking
    calls return their result buffer; ``async_op=True`` (and ``isend``,
    ``irecv``) return a :class:`Work`. Every rank must issue the same
    collectives in the same order.

    A ``with`` block destroys the communicator at its end (aborts it when the
    block raised, so that peers stop waiting); communicators still alive are
    destroyed at interpreter exit.
    """

    def __init__(self, *a, **k):
        raise TypeError("use gocoll.init(...) or comm.split(...)")

    @classmethod
    def _adopt(cls, lib, handle):
        self = object.__new__(cls)
        self._lib = lib
        self._h = handle
        self._closed = False
        self._interrupted = False  # aborted by Ctrl-C (_interrupt)
        self._pending = set()
        self._plock = threading.Lock()
        n, r = ctypes.c_int(), ctypes.c_int()
        _check_call(lib.gocollCommCount(handle, ctypes.byref(n)), "gocollCommCount", handle)
        _check_call(lib.gocollCommUserRank(handle, ctypes.byref(r)), "gocollCommUserRank", handle)
        self._size = n.value
        self._rank = r.value
        self._waiter = None
        _register(self)
        return self

    # -- properties ---------------------------------------------------------

    @property
    def rank(self):
        """This process's rank, 0 … size-1."""
        return self._rank

    @property
    def size(self):
        """Number of ranks."""
        return self._size

    def get_rank(self):
        return self._rank

    def get_world_size(self):
        return self._size

    @property
    def handle(self):
        """The gocollComm_t value (an integer), for passing to C code."""
        return self._h

    @property
    def closed(self):
        return self._closed

    def __repr__(self):
        state = "closed" if self._closed else "rank %d of %d" % (self._rank, self._size)
        return "<gocoll.Comm %s>" % state

    # -- lifetime -----------------------------------------------------------

    def _handle(self):
        if self._closed:
            raise errors.InvalidUsage("gocoll: communicator was destroyed or aborted",
                                      code=errors.INVALID_USAGE)
        _lib.check_process()
        return self._h

    def _check(self, rc, op):
        if rc != 0:
            raise _error(self._lib, rc, op, self._h)

    def _forget(self, work):
        with self._plock:
            self._pending.discard(work)

    def pending(self):
        """Number of non-blocking operations not yet known to be finished."""
        with self._plock:
            return len(self._pending)

    def _finish_pending(self):
        with self._plock:
            works = list(self._pending)
        for w in works:
            try:
                w.wait()
            except Exception:
                pass

    def destroy(self):
        """Wait for this rank's outstanding operations, then release the
        communicator (not collective). Idempotent."""
        if self._closed:
            return
        _lib.check_process()
        self._finish_pending()
        self._closed = True
        with _live_lock:
            _live.pop(self._h, None)
        self._stop_waiter()
        rc = self._lib.gocollCommDestroy(self._h)
        if not self._interrupted:  # (else the handle went with the abort)
            self._check(rc, "gocollCommDestroy")

    close = destroy

    def abort(self):
        """Abort: every pending operation on this rank fails at once and the
        peers are told. Never blocks on peers. Idempotent."""
        if self._closed:
            return
        _lib.check_process()
        self._closed = True
        with _live_lock:
            _live.pop(self._h, None)
        rc = self._lib.gocollCommAbort(self._h)
        self._finish_pending()  # frees the requests; they report the abort
        self._stop_waiter()
        if not self._interrupted:  # (else Ctrl-C aborted it already)
            self._check(rc, "gocollCommAbort")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._closed:
            return False
        if exc_type is None:
            self.destroy()
        else:
            try:
                self.abort()
            except Exception:
                pass
        return False

    def async_error(self):
        """The error that made this communicator unusable (an :class:`Error`
        instance, not raised), or None while it is healthy."""
        e = ctypes.c_int()
        self._check(self._lib.gocollCommGetAsyncError(self._handle(), ctypes.byref(e)),
                    "gocollCommGetAsyncError")
        if e.value == 0:
            return None
        return _error(self._lib, e.value, "async", self._h)

    def last_error(self):
        """gocollGetLastError text for this communicator ("" if none)."""
        s = self._lib.gocollGetLastError(self._h)
        return s.decode("utf-8", "replace") if s else ""

    def topology(self):
        """The communicator's topology as a dict (gocollCommGetTopology):
        ``rank``, ``ranks``, ``hosts`` (each with its ``ranks``), ``ring``,
        ``graph`` (hosts, nodes and links with bandwidth and latency) and
        ``local_host`` (cores, NUMA nodes, caches of this machine)."""
        need = ctypes.c_size_t()
        self._check(self._lib.gocollCommGetTopology(self._handle(), None, 0, ctypes.byref(need)),
                    "gocollCommGetTopology")
        buf = ctypes.create_string_buffer(need.value)
        self._check(self._lib.gocollCommGetTopology(self._handle(), buf, need.value, ctypes.byref(need)),
                    "gocollCommGetTopology")
        return json.loads(buf.value.decode("utf-8"))

    def dump_state(self):
        """Write the flight recorder's dump (gocollCommDumpState) - the last
        GOCOLL_FLIGHT_RECORDS operations and those in flight, as JSON - to
        GOCOLL_DUMP_DIR (default: the temp dir) and return the file's path.
        ``gocoll-doctor DIR`` reads every rank's dump and says which rank
        did not arrive where."""
        buf = ctypes.create_string_buffer(4096)
        self._check(self._lib.gocollCommDumpState(self._handle(), buf, len(buf)),
                    "gocollCommDumpState")
        return buf.value.decode("utf-8", "surrogateescape")

    def split(self, color, key=None):
        """Collective: ranks passing the same ``color`` form a new
        communicator ranked by ``key`` (default: this rank). ``color=None``
        takes part without joining any (returns None)."""
        c = _lib.SPLIT_NOCOLOR if color is None else _c_int(color, "split: color")
        k = self._rank if key is None else _c_int(key, "split: key")
        out = _lib.Comm()
        self._check(self._lib.gocollCommSplit(self._handle(), c, k, ctypes.byref(out)),
                    "gocollCommSplit")
        if not out.value:
            return None
        return Comm._adopt(self._lib, out.value)

    # -- surviving a lost rank (docs/elastic.md) -----------------------------

    def revoke(self):
        """Revoke: every operation pending on this communicator, here and on
        the peers, and every later one raises :class:`~gocoll.errors.Revoked`.
        Never blocks; idempotent. The communicator can still be shrunk."""
        self._check(self._lib.gocollCommRevoke(self._handle(), 0), "gocollCommRevoke")

    def shrink(self, exclude=None, *, revoke=True, timeout=None):
        """A new communicator of the ranks that go on, renumbered 0, 1, … in
        their order here. Every such rank calls it.

        ``exclude=None``: the ranks agree among themselves which ranks
        failed (a dead process, or one silent past the timeout) — the call
        after a collective raised one of ``gocoll.errors.PEER_FAILURES``.
        Otherwise the ranks listed are left out (they do not call it).
        ``revoke`` (default) first revokes this communicator so that
        operations still pending on it return. ``timeout`` (seconds): the
        new communicator's, else this one's settings. A rank the others left
        out gets :class:`~gocoll.errors.Excluded`. This communicator stays:
        destroy it when done."""
        h = self._handle()
        if exclude is None:
            arr, n = None, 0
        else:
            ranks = [_c_int(r, "shrink: exclude") for r in exclude]
            n = len(ranks)
            arr = (ctypes.c_int * max(n, 1))(*ranks)
        config = _config(timeout, None, None)
        out = _lib.Comm()
        self._check(self._lib.gocollCommShrink(h, arr, n, ctypes.byref(out),
                                                None if config is None else ctypes.byref(config),
                                                _lib_SHRINK_ABORT if revoke else 0),
                    "gocollCommShrink")
        return Comm._adopt(self._lib, out.value)

    def failed(self):
        """The ranks this rank knows failed, ascending (gocollCommGetFailed):
        ranks whose connection broke, and after a shrink those it left out."""
        h = self._handle()
        n = ctypes.c_int()
        self._check(self._lib.gocollCommGetFailed(h, None, 0, ctypes.byref(n)), "gocollCommGetFailed")
        arr = (ctypes.c_int * max(n.value, 1))()
        self._check(self._lib.gocollCommGetFailed(h, arr, n.value, ctypes.byref(n)), "gocollCommGetFailed")
        return [arr[i] for i in range(min(n.value, len(arr)))]

    def join_info(self):
        """How a new process reaches this communicator to join it
        (:func:`gocoll.join`): a string, nothing secret in it."""
        need = ctypes.c_size_t()
        self._check(self._lib.gocollCommJoinInfo(self._handle(), None, 0, ctypes.byref(need)),
                    "gocollCommJoinInfo")
        buf = ctypes.create_string_buffer(need.value)
        self._check(self._lib.gocollCommJoinInfo(self._handle(), buf, need.value, ctypes.byref(need)),
                    "gocollCommJoinInfo")
        return buf.value.decode("utf-8")

    def joiners(self):
        """How many processes wait to join (on rank 0; 0 elsewhere). Check
        it at a step boundary, tell the other ranks, then :meth:`grow`."""
        n = ctypes.c_int()
        self._check(self._lib.gocollCommJoiners(self._handle(), ctypes.byref(n)), "gocollCommJoiners")
        return n.value

    def grow(self, n):
        """Collective: a new communicator of these ranks (same numbers) and
        ``n`` processes waiting in :func:`gocoll.join`, numbered from
        ``size`` up. Rank 0 waits up to the timeout for them."""
        out = _lib.Comm()
        self._check(self._lib.gocollCommGrow(self._handle(), _c_int(n, "grow: n"), ctypes.byref(out)),
                    "gocollCommGrow")
        return Comm._adopt(self._lib, out.value)

    # -- memory -------------------------------------------------------------

    def mem_alloc(self, nbytes):
        """``nbytes`` of page-aligned memory from gocollMemAlloc (what the
        shared-memory path reads in place), as a :class:`MemBlock`; freed
        when the block and every array made from it are garbage."""
        nbytes = _c_size(nbytes, "mem_alloc: size")
        if nbytes <= 0:
            raise errors.InvalidArgument("gocoll: mem_alloc: size must be positive, got %d" % nbytes)
        p = ctypes.c_void_p()
        self._check(self._lib.gocollMemAlloc(ctypes.byref(p), nbytes, self._handle()),
                    "gocollMemAlloc")
        return MemBlock(self._lib, p.value, nbytes)

    def empty(self, shape, dtype="float32"):
        """A numpy array in gocollMemAlloc memory (uninitialised).
        (``gocoll.torch.empty(comm, ...)`` makes torch tensors.)"""
        import numpy as np
        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = 1
        for s in shape:
            n *= int(s)
        block = self.mem_alloc(max(n * dt.itemsize, 1))
        return block.numpy(dt, n).reshape(shape)

    # -- the call itself ----------------------------------------------------

    def _run(self, name, args, async_op, keep, result, op, post=None, source=None):
        """Call ``name`` (blocking) or its I-form (``async_op``: returns a
        :class:`Work`); ``post`` runs once the call succeeded; ``source``
        is the C int a receive from any source stores the sender in."""
        h = self._handle()
        if not async_op:
            noted = _interrupt.enter(self)  # Ctrl-C aborts this call
            try:
                rc = getattr(self._lib, name)(*args, h)
            finally:
                if noted:
                    _interrupt.leave()
            if rc != 0:
                raise _error(self._lib, rc, op, h)
            if post is not None:
                post()
            return result
        req = ctypes.c_void_p()
        rc = getattr(self._lib, "gocollI" + name[len("gocoll"):])(*args, h, ctypes.byref(req))
        if rc != 0:
            raise _error(self._lib, rc, op, h)
        w = Work(self, req.value, keep, result, op, post, source)
        with self._plock:
            self._pending.add(w)
        return w

    def _peer(self, peer, what):
        p = _c_int(peer, what)
        if not 0 <= p < self._size:
            raise errors.InvalidArgument("gocoll: %s %d is outside [0, %d)" % (what, p, self._size))
        return p

    def _out(self, inp, out, what, shape, count):
        """Validate or allocate an output of ``count`` elements like ``inp``."""
        if out is None:
            o = as_buffer(_buffer.new_like(inp, shape), what)
            return o
        o = as_buffer(out, what, writable=True)
        _buffer.same_kind(inp, o, what)
        if o.count != count:
            raise errors.InvalidArgument(
                "gocoll: %s has %d elements, want %d (%s)" % (what, o.count, count,
                                                               "shape %s" % (shape,)))
        return o

    def _list(self, objs, what, like, equal=True):
        """Check a list of arrays/tensors (one per rank, any layout: gocoll
        copies from or into them) against ``like``'s dtype, and its element
        count when ``equal``; returns their element counts."""
        if isinstance(objs, (str, bytes)) or not hasattr(objs, "__len__"):
            raise TypeError("gocoll: %s must be a list of %d tensors, got %s"
                            % (what, self._size, type(objs).__name__))
        if len(objs) != self._size:
            raise errors.InvalidArgument("gocoll: %s has %d entries, want one per rank (%d)"
                                         % (what, len(objs), self._size))
        counts = []
        for i, o in enumerate(objs):
            dt, count = _buffer.dtype_count(o, "%s[%d]" % (what, i))
            if dt != like.dtype:
                raise errors.InvalidArgument("gocoll: %s[%d] has dtype %s, want %s" % (
                    what, i, _buffer.TYPE_NAMES[dt], _buffer.TYPE_NAMES[like.dtype]))
            if equal and count != like.count:
                raise errors.InvalidArgument("gocoll: %s[%d] has %d elements, want %d"
                                             % (what, i, count, like.count))
            counts.append(count)
        return counts

    # -- completion callbacks -----------------------------------------------

    def on_complete(self, work, callback):
        """Call ``callback(work)`` on this communicator's waiter thread once
        ``work`` finished. Collectives complete in issue order, so one
        thread waiting on them in order adds no delay (used by the DDP hook
        and futures); a tagged receive that finishes before works issued
        earlier gets its callback after theirs."""
        with self._plock:
            if self._waiter is None:
                self._waiter = _Waiter(self)
            waiter = self._waiter
        waiter.put(work, callback)

    def _stop_waiter(self):
        with self._plock:
            w, self._waiter = self._waiter, None
        if w is not None:
            w.stop()


class MemBlock:
    """Memory from gocollMemAlloc. ``numpy()`` views it as an array (the
    array keeps the block alive); gocollMemFree runs when the block and all
    views are garbage (not at interpreter exit, where an operation might
    still use it)."""

    def __init__(self, lib, ptr, nbytes):
        import weakref
        self.ptr = ptr
        self.nbytes = nbytes
        self.__array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
        }
        fin = weakref.finalize(self, MemBlock._free, lib, ptr)
        fin.atexit = False

    @staticmethod
    def _free(lib, ptr):
        if not _lib.forked():
            lib.gocollMemFree(ptr, None)

    def numpy(self, dtype="uint8", count=None):
        """A 1-D numpy view of the block (``count`` elements of ``dtype``)."""
        import numpy as np
        dt = np.dtype(dtype)
        raw = np.asarray(self)
        n = self.nbytes // dt.itemsize if count is None else int(count)
        return raw[: n * dt.itemsize].view(dt)
