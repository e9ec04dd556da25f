"""Communicators, collectives and requests over the C ABI (gocoll.h)."""

import atexit
import ctypes
import datetime
import enum
import itertools
import json
import math
import numbers
import operator
import sys
import threading
import time
import zlib

from . import _buffer, _interrupt, _lib, errors
from ._buffer import as_buffer


class ReduceOp(enum.IntEnum):
    """gocollRedOp_t. Methods also accept the names as strings, and
    torch.distributed.ReduceOp values.

    BAND, BOR and BXOR (bitwise and, or, xor) take integer and bool buffers
    only. On bool buffers SUM and MAX are logical or, PROD and MIN logical
    and (torch's rules); AVG is refused."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


class DataType(enum.IntEnum):
    """gocollDataType_t (informational: buffers carry their dtype). 10 and 11
    are NCCL's float8 numbers, no types in gocoll."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9
    INT16 = 12
    BOOL = 13


_OP_NAMES = {
    "sum": 0, "prod": 1, "product": 1, "max": 2, "min": 3, "avg": 4, "mean": 4, "average": 4,
    "band": 5, "bor": 6, "bxor": 7,
}
_OP_LIST = "'sum', 'prod', 'max', 'min', 'avg', 'band', 'bor', 'bxor'"
# torch.distributed.ReduceOp names -> gocollRedOp_t
_TORCH_OPS = (("SUM", 0), ("PRODUCT", 1), ("MAX", 2), ("MIN", 3), ("AVG", 4), ("BAND", 5),
              ("BOR", 6), ("BXOR", 7))


_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
MONITOR_TAG = _INT_MAX  # the message tag monitored_barrier uses; user tags are below it
_SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1


def _c_int(value, what):
    """``value`` as a C int, or InvalidArgument naming ``what``: a string
    such as "1" or a float is refused rather than converted (a silent int()
    would hide a caller's mix-up), and so is a value ctypes would truncate."""
    try:
        v = operator.index(value)
    except TypeError:
        raise errors.InvalidArgument("gocoll: %s must be an integer, got %r" % (what, value)) from None
    if not _INT_MIN <= v <= _INT_MAX:
        raise errors.InvalidArgument("gocoll: %s %d does not fit a C int" % (what, v))
    return v


def _c_size(value, what):
    """``value`` as a C size_t (a non-negative integer), or InvalidArgument."""
    try:
        v = operator.index(value)
    except TypeError:
        raise errors.InvalidArgument("gocoll: %s must be an integer, got %r" % (what, value)) from None
    if not 0 <= v <= _SIZE_MAX:
        raise errors.InvalidArgument("gocoll: %s %d is not a valid size" % (what, v))
    return v


def _op(op):
    if isinstance(op, str):
        v = _OP_NAMES.get(op.lower())
        if v is None:
            raise errors.InvalidArgument(
                "gocoll: unknown reduction op %r; use one of %s or gocoll.ReduceOp" % (op, _OP_LIST))
        return v
    if isinstance(op, int) and not isinstance(op, bool) and 0 <= op <= 7:
        return int(op)
    td = sys.modules.get("torch.distributed")
    red = getattr(td, "ReduceOp", None)
    if red is not None and isinstance(op, (red, getattr(red, "RedOpType", red))):
        for name, v in _TORCH_OPS:
            if hasattr(red, name) and op == getattr(red, name):
                return v
    raise errors.InvalidArgument("gocoll: unknown reduction op %r; use one of %s or gocoll.ReduceOp"
                                 % (op, _OP_LIST))


def _error(lib, rc, op, comm_handle):
    detail = lib.gocollGetLastError(comm_handle)
    detail = detail.decode("utf-8", "replace") if detail else ""
    reason = lib.gocollGetErrorString(rc)
    reason = reason.decode("utf-8", "replace") if reason else None
    if not detail:
        detail = "gocoll: %s failed: %s" % (op, reason)
    return errors.from_code(rc, detail, reason, op)


def _check_call(rc, op, comm_handle=None):
    if rc != 0:
        raise _error(_lib.load(), rc, op, comm_handle)


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


class Work:
    """A non-blocking operation, with torch.distributed's ``Work`` methods.
    Keeps the Python objects of its buffers alive until it completed (also
    when the caller drops this handle: the communicator holds it until it is
    done)."""

    __slots__ = ("_comm", "_req", "_keep", "_result", "_op", "_lock", "_done", "_exc", "_post",
                 "_fut", "_source", "__weakref__")

    def __init__(self, comm, req, keep, result, op, post=None, source=None):
        self._comm = comm
        self._req = req
        self._keep = keep
        self._result = result
        self._op = op
        self._post = post  # run once on success (copying out of a staging buffer)
        self._lock = threading.Lock()
        self._done = False
        self._exc = None
        self._fut = None
        self._source = source  # a receive from any source: the C int gocoll writes the sender in

    def _finish(self, rc):
        # with self._lock held
        if rc != 0 and self._comm._interrupted:
            # Said plainly: C++ waiters (DDP) see only this text, while
            # Python raises KeyboardInterrupt at its next bytecode.
            self._exc = errors.InvalidUsage(
                "gocoll: %s on rank %d interrupted: Ctrl-C (SIGINT) aborted the communicator"
                % (self._op, self._comm._rank), code=errors.INVALID_USAGE, op=self._op)
        elif rc != 0:
            self._exc = _error(self._comm._lib, rc, self._op, self._comm._h)
        elif self._post is not None:
            try:
                self._post()
            except Exception as e:  # a staging copy that failed is the operation's error
                self._exc = e
        self._done = True
        self._req = None
        self._keep = None
        self._post = None
        self._comm._forget(self)

    def wait(self, timeout=None):
        """Block until the operation finished and return its result buffer
        (None for barrier and send); raise the operation's error if it
        failed. Never longer than GOCOLL_TIMEOUT after the operation started.

        ``timeout`` (seconds or a ``datetime.timedelta``; None or 0: no
        limit of its own) raises :class:`gocoll.Timeout` when it passes
        first; the operation goes on and can be waited for again."""
        if not self._done:
            _lib.check_process()
            ms = _timeout_ms(timeout)
            # Another thread (the communicator's waiter) may be inside a
            # wait on this work: a timed wait must not block on it longer.
            if not self._lock.acquire(timeout=-1 if ms is None else ms / 1000):
                if not self._done:
                    raise self._timed_out(timeout)
            else:
                try:
                    if not self._done:
                        self._wait_locked(ms)
                finally:
                    self._lock.release()
            if not self._done:
                raise self._timed_out(timeout)
        if self._exc is not None:
            raise self._exc
        return self._result

    def _wait_locked(self, ms):
        lib = self._comm._lib
        noted = _interrupt.enter(self._comm)  # Ctrl-C aborts the communicator
        try:
            if ms is None:
                rc, done = lib.gocollWait(self._req), 1
            else:
                d = ctypes.c_int()
                rc = lib.gocollWaitTimeout(self._req, ms, ctypes.byref(d))
                done = d.value
        finally:
            if noted:
                _interrupt.leave()
        if done:
            self._finish(rc)
        elif rc != 0:
            raise _error(lib, rc, "gocollWaitTimeout", self._comm._h)

    def _timed_out(self, timeout):
        return errors.Timeout("gocoll: %s on rank %d did not finish within %s (Work.wait timeout); "
                              "the operation is still pending" % (self._op, self._comm._rank, timeout),
                              code=errors.TIMEOUT, op=self._op)

    def is_completed(self):
        """True once the operation finished (successfully or not); never blocks.
        Errors are raised by :meth:`wait`."""
        if self._done:
            return True
        _lib.check_process()
        if not self._lock.acquire(blocking=False):
            return False  # another thread is waiting on it
        try:
            if not self._done:
                done = ctypes.c_int()
                rc = self._comm._lib.gocollTest(self._req, ctypes.byref(done))
                if done.value:
                    self._finish(rc)
                elif rc != 0:
                    raise _error(self._comm._lib, rc, "gocollTest", self._comm._h)
        finally:
            self._lock.release()
        return self._done

    def source_rank(self):
        """The rank a receive from any source (``recv(t, src=None)``) took
        its message from; waits for the receive first (and raises its
        error). RuntimeError for other operations, as torch's Work."""
        if self._source is None:
            raise errors.InvalidUsage("gocoll: %s: source_rank() is only defined for a recv from "
                                      "any source (src=None)" % self._op,
                                      code=errors.INVALID_USAGE, op=self._op)
        self.wait()
        return self._source.value

    def is_success(self):
        """Whether the finished operation succeeded; RuntimeError before it finished."""
        if not self.is_completed():
            raise RuntimeError("gocoll: %s: is_success() called before the operation finished"
                               % self._op)
        return self._exc is None

    def exception(self):
        """The error the finished operation raised, else None."""
        return self._exc

    def result(self):
        """Alias of :meth:`wait`."""
        return self.wait()

    def get_future(self):
        """A ``torch.futures.Future`` completed, once the operation finished,
        with ``[result]`` (``[]`` for barrier and send, as torch's futures
        hold the output tensors) or with the operation's error, which C++
        consumers such as DDP receive as a real error. Completed by the
        communicator's waiter thread, which follows issue order."""
        with self._lock:
            if self._fut is None:
                from . import _futures  # torch is needed only here
                self._fut = _futures.of_work(self)
            return self._fut

    def __repr__(self):
        state = "done" if self._done else "pending"
        return "<gocoll.Work %s %s>" % (self._op, state)


def _timeout_ms(timeout):
    """A wait's timeout in milliseconds for gocollWaitTimeout; None: none."""
    if timeout is None:
        return None
    secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    try:
        secs = float(secs)
    except (TypeError, ValueError):
        raise errors.InvalidArgument("gocoll: wait: timeout must be seconds or a timedelta, got %r"
                                     % (timeout,)) from None
    if secs < 0 or secs != secs:
        raise errors.InvalidArgument("gocoll: wait: timeout %r is negative" % (timeout,))
    if secs == 0:
        return None  # torch's C++ passes a zero timeout for "none"
    return min(int(secs * 1000 + 0.999), _INT_MAX)


def _ptr_array(values, n, what, op="alltoallv"):
    if values is None:
        return None
    try:
        vals = [operator.index(v) for v in values]
    except TypeError:
        raise errors.InvalidArgument("gocoll: %s: %s must hold integers, got %r" % (op, what, values)) from None
    if len(vals) != n:
        raise errors.InvalidArgument("gocoll: %s: %s has %d entries, want one per rank (%d)"
                                     % (op, what, len(vals), n))
    if any(v < 0 for v in vals):
        raise errors.InvalidArgument("gocoll: %s: %s has a negative entry: %s" % (op, what, vals))
    if any(v > _SIZE_MAX for v in vals):
        raise errors.InvalidArgument("gocoll: %s: %s has an entry too large for size_t: %s" % (op, what, vals))
    return vals


def _block_types(types, n, what):
    """alltoallw block types: an int n (n contiguous elements) or a
    (count, blocklen, stride) vector, one per rank."""
    if types is None or len(types) != n:
        raise errors.InvalidArgument("gocoll: alltoallw: %s needs one type per rank (%d), got %r"
                                     % (what, n, types))
    out = []
    for t in types:
        try:
            vec = (1, operator.index(t), operator.index(t))
        except TypeError:
            vec = t
        try:
            count, blocklen, stride = (operator.index(v) for v in vec)
        except (TypeError, ValueError):
            raise errors.InvalidArgument("gocoll: alltoallw: %s entries are element counts or "
                                         "(count, blocklen, stride) vectors, got %r" % (what, t)) from None
        if min(count, blocklen, stride) < 0 or max(count, blocklen, stride) > _SIZE_MAX:
            raise errors.InvalidArgument("gocoll: alltoallw: %s entry %r is negative or too large" % (what, t))
        out.append((count, blocklen, stride))
    return out


def _extent(t):
    """Elements a (count, blocklen, stride) block spans."""
    count, blocklen, stride = t
    return 0 if count == 0 or blocklen == 0 else (count - 1) * stride + blocklen


def _fingerprint(kinds):
    """8 bytes naming a list of (datatype, count): all_gather_coalesced's
    check that every rank packed the same tensors."""
    h = zlib.crc32(repr(kinds).encode())
    return h.to_bytes(4, "little") + (len(kinds) & 0xFFFFFFFF).to_bytes(4, "little")


def _prefix(counts):
    return list(itertools.accumulate([0] + counts[:-1]))


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


class Comm:
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

    # -- collectives (torch.distributed's names, arguments and order) --------

    def all_reduce(self, tensor, op="sum", *, out=None, async_op=False):
        """Reduce ``tensor`` over all ranks with ``op`` ("sum", "prod", "max",
        "min", "avg", gocoll.ReduceOp or torch's ReduceOp); the result
        replaces ``tensor`` (in place) or goes to ``out``. Returns the result
        buffer, or a :class:`Work` when ``async_op``."""
        b = as_buffer(tensor, "all_reduce tensor", writable=out is None)
        o = b if out is None else self._out(b, out, "all_reduce out", tuple(getattr(tensor, "shape", ())), b.count)
        return self._run("gocollAllReduce", (b.ptr, o.ptr, b.count, b.dtype, _op(op)), async_op,
                         (b.obj, o.obj), o.obj, "all_reduce")

    def reduce(self, tensor, dst=0, op="sum", *, out=None, async_op=False):
        """Like all_reduce, but only rank ``dst`` receives the result (into
        ``tensor``, or ``out``); other ranks' buffers are left unchanged."""
        dst = self._peer(dst, "reduce dst")
        is_root = dst == self._rank
        b = as_buffer(tensor, "reduce tensor", writable=is_root and out is None)
        if out is None:
            o = b
        elif is_root:
            o = self._out(b, out, "reduce out", tuple(tensor.shape), b.count)
        else:
            o = as_buffer(out, "reduce out", writable=False)
        return self._run("gocollReduce", (b.ptr, o.ptr, b.count, b.dtype, _op(op), dst), async_op,
                         (b.obj, o.obj), o.obj, "reduce")

    def broadcast(self, tensor, src=0, *, out=None, async_op=False):
        """Copy rank ``src``'s ``tensor`` to every rank's ``tensor`` (or ``out``)."""
        src = self._peer(src, "broadcast src")
        is_root = src == self._rank
        b = as_buffer(tensor, "broadcast tensor", writable=out is None and not is_root)
        o = b if out is None else self._out(b, out, "broadcast out", tuple(tensor.shape), b.count)
        return self._run("gocollBroadcast", (b.ptr, o.ptr, b.count, b.dtype, src), async_op,
                         (b.obj, o.obj), o.obj, "broadcast")

    def all_gather(self, tensor_list, tensor, *, async_op=False):
        """torch's list form: every rank's ``tensor`` lands in
        ``tensor_list[rank]`` (one tensor per rank, each of ``tensor``'s size
        and dtype, any shape). Gathers into a staging buffer and copies out;
        :meth:`all_gather_into_tensor` avoids the copy."""
        b = as_buffer(tensor, "all_gather tensor", writable=False)
        self._list(tensor_list, "all_gather tensor_list", b)
        k = b.count
        flat = as_buffer(_buffer.new_like(b, (self._size * k,)), "all_gather staging")

        def post():
            for i, o in enumerate(tensor_list):
                _buffer.copy_into(o, flat.obj[i * k:(i + 1) * k])
        return self._run("gocollAllGather", (b.ptr, flat.ptr, k, b.dtype), async_op,
                         (b.obj, flat.obj, tensor_list), tensor_list, "all_gather", post)

    def all_gather_into_tensor(self, output, input, *, async_op=False):
        """Every rank's ``input`` concatenated in rank order into ``output``
        (size × input elements); ``output=None`` makes a new buffer of shape
        ``(size, *input.shape)``. In place when ``input`` is ``output``'s
        block ``rank``."""
        b = as_buffer(input, "all_gather_into_tensor input", writable=False)
        shape = (self._size,) + tuple(input.shape)
        o = self._out(b, output, "all_gather_into_tensor output", shape, b.count * self._size)
        return self._run("gocollAllGather", (b.ptr, o.ptr, b.count, b.dtype), async_op,
                         (b.obj, o.obj), o.obj, "all_gather_into_tensor")

    def all_gather_coalesced(self, output_lists, input_list, *, async_op=False):
        """torch's all_gather_coalesced: ``output_lists[r][j]`` receives rank
        ``r``'s ``input_list[j]``. The tensors may differ in size and dtype
        (empty ones included), and may be non-contiguous; each output must
        have its input's dtype and element count. Done as ONE all-gather of
        bytes: each rank packs its inputs behind a fingerprint of their
        dtypes and counts, so ranks that pass different lists get
        :class:`gocoll.InvalidUsage` (a different total size fails in the
        all-gather itself) instead of misplaced bytes."""
        if isinstance(input_list, (str, bytes)) or not hasattr(input_list, "__len__"):
            raise TypeError("gocoll: all_gather_coalesced input_list must be a list of tensors, "
                            "got %s" % type(input_list).__name__)
        parts = [_buffer.byte_source(x, "all_gather_coalesced input_list[%d]" % j)
                 for j, x in enumerate(input_list)]
        kinds = [(p.dtype, p.count) for p in parts]
        if isinstance(output_lists, (str, bytes)) or not hasattr(output_lists, "__len__") \
                or len(output_lists) != self._size:
            raise errors.InvalidArgument("gocoll: all_gather_coalesced output_lists must hold one "
                                         "list per rank (%d)" % self._size)
        for r, outs in enumerate(output_lists):
            if len(outs) != len(parts):
                raise errors.InvalidArgument("gocoll: all_gather_coalesced output_lists[%d] has %d "
                                             "tensors, input_list %d" % (r, len(outs), len(parts)))
            for j, o in enumerate(outs):
                what = "all_gather_coalesced output_lists[%d][%d]" % (r, j)
                if _buffer.dtype_count(o, what) != kinds[j]:
                    dt, n = _buffer.dtype_count(o, what)
                    raise errors.InvalidArgument("gocoll: %s is %s[%d], want input_list[%d]'s %s"
                                                 % (what, _buffer.TYPE_NAMES[dt], n, j,
                                                    parts[j].describe()))
        fp = _fingerprint(kinds)
        block = len(fp) + sum(p.nbytes for p in parts)
        send = (ctypes.c_char * block)()
        base = ctypes.addressof(send)
        ctypes.memmove(base, fp, len(fp))
        off = len(fp)
        for p in parts:
            ctypes.memmove(base + off, p.ptr, p.nbytes)
            off += p.nbytes
        gathered = (ctypes.c_char * (block * self._size))()

        def post():
            at = ctypes.addressof(gathered)
            for r, outs in enumerate(output_lists):
                start = at + r * block
                if ctypes.string_at(start, len(fp)) != fp:
                    raise errors.InvalidUsage(
                        "gocoll: all_gather_coalesced on rank %d: rank %d passed other tensors "
                        "(dtypes and element counts differ from this rank's %s)"
                        % (self._rank, r, [p.describe() for p in parts]),
                        code=errors.INVALID_USAGE, op="all_gather_coalesced")
                off = start + len(fp)
                for o, p in zip(outs, parts):
                    _buffer.write_bytes(o, off, p.nbytes)
                    off += p.nbytes
        return self._run("gocollAllGather", (base, ctypes.addressof(gathered), block,
                                             _buffer.UINT8), async_op,
                         (send, gathered, parts, output_lists), output_lists,
                         "all_gather_coalesced", post)

    def reduce_scatter(self, output, input, op="sum", *, async_op=False):
        """Reduce over all ranks and give block ``rank`` to this rank's
        ``output``. ``input`` is torch's list of one tensor per rank (each of
        ``output``'s size), or one tensor of size × output elements (as
        :meth:`reduce_scatter_tensor`)."""
        if isinstance(input, (list, tuple)):
            o = as_buffer(output, "reduce_scatter output", writable=True)
            self._list(input, "reduce_scatter input", o)
            flat = as_buffer(_buffer.concat(list(input)), "reduce_scatter staging", writable=False)
            return self._run("gocollReduceScatter", (flat.ptr, o.ptr, o.count, o.dtype, _op(op)),
                             async_op, (flat.obj, o.obj), o.obj, "reduce_scatter")
        return self.reduce_scatter_tensor(output, input, op, async_op=async_op)

    def reduce_scatter_tensor(self, output, input, op="sum", *, async_op=False):
        """Reduce ``input`` (size blocks of equal length) over all ranks and
        give block ``rank`` to this rank: into ``output``, or (``output=None``)
        a new buffer of shape ``input.shape[1:]`` (if ``input.shape[0] ==
        size``) or ``(numel // size,)``. In place when ``output`` is
        ``input``'s block ``rank``."""
        b = as_buffer(input, "reduce_scatter_tensor input", writable=False)
        if b.count % self._size:
            raise errors.InvalidArgument(
                "gocoll: reduce_scatter_tensor input has %d elements, not a multiple of the %d "
                "ranks" % (b.count, self._size))
        n = b.count // self._size
        shp = tuple(input.shape)
        shape = shp[1:] if shp and shp[0] == self._size else (n,)
        o = self._out(b, output, "reduce_scatter_tensor output", shape, n)
        return self._run("gocollReduceScatter", (b.ptr, o.ptr, n, b.dtype, _op(op)), async_op,
                         (b.obj, o.obj), o.obj, "reduce_scatter_tensor")

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, *,
                          async_op=False):
        """``input`` split along dim 0 (equally, or in ``input_split_sizes``
        rows) goes to the ranks in order; the received rows fill ``output``
        (split by ``output_split_sizes``). With equal splits ``output`` may
        be ``input`` (in place) or None (a new buffer like ``input``)."""
        n = self._size
        if not output_split_sizes and not input_split_sizes:
            b = as_buffer(input, "all_to_all_single input", writable=output is input)
            if b.count % n:
                raise errors.InvalidArgument("gocoll: all_to_all_single: input has %d elements, not "
                                             "divisible by the %d ranks" % (b.count, n))
            o = b if output is input else self._out(b, output, "all_to_all_single output",
                                                    tuple(input.shape), b.count)
            return self._run("gocollAllToAll", (b.ptr, o.ptr, b.count // n, b.dtype), async_op,
                             (b.obj, o.obj), o.obj, "all_to_all_single")

        def counts(t, splits, what):
            shape = tuple(t.shape)
            rows = shape[0] if shape else 1
            numel = t.numel() if callable(t.size) else int(t.size)  # torch or numpy
            per_row = numel // rows if rows else 0
            if not splits:
                if rows % n:
                    raise errors.InvalidArgument("gocoll: all_to_all_single: %s has %d rows, not "
                                                 "divisible by the %d ranks" % (what, rows, n))
                return [rows // n * per_row] * n
            try:
                splits = [operator.index(s) for s in splits]
            except TypeError:
                raise errors.InvalidArgument("gocoll: all_to_all_single: %s split sizes must be "
                                             "integers, got %r" % (what, splits)) from None
            if len(splits) != n or sum(splits) != rows or min(splits) < 0:
                raise errors.InvalidArgument("gocoll: all_to_all_single: %s split sizes %s must be "
                                             "%d non-negative row counts adding up to %d"
                                             % (what, splits, n, rows))
            return [s * per_row for s in splits]

        if output is None:
            raise errors.InvalidArgument("gocoll: all_to_all_single: output is needed with split sizes")
        sc = counts(input, input_split_sizes, "input")
        rc = counts(output, output_split_sizes, "output")
        return self._alltoallv(input, sc, rc, None, None, output, async_op, "all_to_all_single")

    def all_to_all(self, output_tensor_list, input_tensor_list, *, async_op=False):
        """torch's list form: ``input_tensor_list[j]`` goes to rank j, which
        stores it in its ``output_tensor_list[rank]``; sizes may differ per
        pair (through a staging buffer)."""
        n = self._size
        if len(input_tensor_list) != n or len(output_tensor_list) != n:
            raise errors.InvalidArgument("gocoll: all_to_all: need %d input and output tensors, got "
                                         "%d and %d" % (n, len(input_tensor_list),
                                                        len(output_tensor_list)))
        dt, _ = _buffer.dtype_count(input_tensor_list[0], "all_to_all input_tensor_list[0]")
        first = _buffer.Buffer(input_tensor_list[0], 0, 0, dt, _buffer.is_tensor(input_tensor_list[0]))
        sc = self._list(input_tensor_list, "all_to_all input_tensor_list", first, equal=False)
        rc = self._list(output_tensor_list, "all_to_all output_tensor_list", first, equal=False)
        flat_in = _buffer.concat(list(input_tensor_list))
        flat_out = _buffer.new_like(first, (sum(rc),))

        def post():
            off = 0
            for t, c in zip(output_tensor_list, rc):
                _buffer.copy_into(t, flat_out[off:off + c])
                off += c
        return self._alltoallv(flat_in, sc, rc, None, None, flat_out, async_op,
                               "all_to_all", post, result=output_tensor_list)

    def alltoallv(self, tensor, send_counts, recv_counts, *, send_displs=None, recv_displs=None,
                  out=None, async_op=False):
        """All-to-all with per-peer counts in elements (torch has no such
        call): ``send_counts[j]`` elements from ``tensor`` at
        ``send_displs[j]`` go to rank j, which stores them at
        ``recv_displs[rank]`` of its ``out``. Displacements default to the
        packed prefix sums; ``out`` defaults to a new 1-D buffer just large
        enough."""
        return self._alltoallv(tensor, send_counts, recv_counts, send_displs, recv_displs, out,
                               async_op, "alltoallv")

    def _alltoallv(self, tensor, send_counts, recv_counts, send_displs, recv_displs, out, async_op,
                   op, post=None, result=None):
        n = self._size
        sc = _ptr_array(send_counts, n, "send_counts", op)
        rc = _ptr_array(recv_counts, n, "recv_counts", op)
        sd = _ptr_array(send_displs, n, "send_displs", op) or _prefix(sc)
        rd = _ptr_array(recv_displs, n, "recv_displs", op) or _prefix(rc)
        b = as_buffer(tensor, "%s input" % op, writable=False)
        need_s = max((d + c for d, c in zip(sd, sc) if c), default=0)
        if need_s > b.count:
            raise errors.InvalidArgument(
                "gocoll: %s: send blocks reach element %d but the input has %d elements"
                % (op, need_s, b.count))
        need_r = max((d + c for d, c in zip(rd, rc) if c), default=0)
        if out is None:
            o = as_buffer(_buffer.new_like(b, (need_r,)), "%s output" % op)
        else:
            o = as_buffer(out, "%s output" % op, writable=True)
            _buffer.same_kind(b, o, "%s output" % op)
            if need_r > o.count:
                raise errors.InvalidArgument(
                    "gocoll: %s: receive blocks reach element %d but the output has %d elements"
                    % (op, need_r, o.count))
        arr = _lib.c_size_t * n
        a_sc, a_sd, a_rc, a_rd = arr(*sc), arr(*sd), arr(*rc), arr(*rd)
        return self._run("gocollAllToAllv", (b.ptr, a_sc, a_sd, o.ptr, a_rc, a_rd, b.dtype),
                         async_op, (b.obj, o.obj, a_sc, a_sd, a_rc, a_rd),
                         o.obj if result is None else result, op, post)

    def alltoallw(self, tensor, send_types, recv_types, *, send_displs=None, recv_displs=None,
                  out=None, async_op=False):
        """All-to-all with a layout per block, like MPI_Alltoallw: the block
        for rank j lies in ``tensor`` at ``send_displs[j]`` (elements) as
        ``send_types[j]``; rank j stores it in its ``out`` at
        ``recv_displs[rank]`` as ``recv_types[rank]``. A type is an int n (n
        contiguous elements) or a strided vector ``(count, blocklen,
        stride)``: count runs of blocklen elements, stride elements apart.
        Both sides of a block hold as many elements, in any layout; blocks
        are packed and unpacked only in the two ranks' buffers.
        Displacements default to the blocks' extents back to back; ``out``
        defaults to a new 1-D buffer just large enough."""
        n = self._size
        st = _block_types(send_types, n, "send_types")
        rt = _block_types(recv_types, n, "recv_types")
        sd = _ptr_array(send_displs, n, "send_displs", "alltoallw") or _prefix([_extent(t) for t in st])
        rd = _ptr_array(recv_displs, n, "recv_displs", "alltoallw") or _prefix([_extent(t) for t in rt])
        b = as_buffer(tensor, "alltoallw tensor", writable=False)
        need_s = max((d + _extent(t) for d, t in zip(sd, st) if _extent(t)), default=0)
        if need_s > b.count:
            raise errors.InvalidArgument(
                "gocoll: alltoallw: send blocks reach element %d but tensor has %d elements"
                % (need_s, b.count))
        need_r = max((d + _extent(t) for d, t in zip(rd, rt) if _extent(t)), default=0)
        if out is None:
            o = as_buffer(_buffer.new_like(b, (need_r,)), "alltoallw out")
        else:
            o = as_buffer(out, "alltoallw out", writable=True)
            if need_r > o.count:
                raise errors.InvalidArgument(
                    "gocoll: alltoallw: receive blocks reach element %d but out has %d elements"
                    % (need_r, o.count))
        sizes, types = _lib.c_size_t * n, _lib.BlockType * n
        a_sd = sizes(*[d * b.itemsize for d in sd])
        a_rd = sizes(*[d * o.itemsize for d in rd])
        a_st = types(*[(b.dtype,) + t for t in st])
        a_rt = types(*[(o.dtype,) + t for t in rt])
        return self._run("gocollAllToAllw", (b.ptr, a_sd, a_st, o.ptr, a_rd, a_rt), async_op,
                         (b.obj, o.obj, a_sd, a_st, a_rd, a_rt), o.obj, "alltoallw")

    # -- point to point ------------------------------------------------------

    def _tag(self, tag, op):
        t = _c_int(tag, "%s tag" % op)
        if not 0 <= t < MONITOR_TAG:
            raise errors.InvalidArgument("gocoll: %s: tag %d is outside [0, %d] (%d is reserved for "
                                         "monitored_barrier)" % (op, t, MONITOR_TAG - 1, MONITOR_TAG))
        return t

    def send(self, tensor, dst, tag=0, *, async_op=False):
        """Send ``tensor`` to rank ``dst``, whose :meth:`recv` with the same
        ``tag`` (and count and dtype) takes it. Messages to one rank leave in
        issue order; the receiver takes different tags in any order it
        likes, one tag in order. Every message must be received before the
        receiver's next collective on this communicator."""
        dst = self._peer(dst, "send dst")
        tag = self._tag(tag, "send")
        b = as_buffer(tensor, "send tensor", writable=False)
        return self._run("gocollSendTag", (b.ptr, b.count, b.dtype, dst, tag), async_op, (b.obj,),
                         None, "send")

    def recv(self, tensor, src=None, tag=0, *, async_op=False):
        """Receive into ``tensor`` the oldest message from rank ``src`` with
        ``tag`` that no earlier recv took; count and dtype must be the
        sender's (else :class:`gocoll.InvalidUsage`, never a truncated
        message). Returns ``tensor``.

        ``src=None`` receives from any source, as torch.distributed: the
        first message with ``tag`` from whichever rank sent one (each
        sender's messages in the order sent), and returns the sender's
        rank; with ``async_op`` the :class:`Work`'s ``source_rank()`` says
        it once the receive finished."""
        tag = self._tag(tag, "recv")
        b = as_buffer(tensor, "recv tensor", writable=True)
        if src is None:
            source = ctypes.c_int(-1)
            r = self._run("gocollRecvAny", (b.ptr, b.count, b.dtype, tag, ctypes.byref(source)),
                          async_op, (b.obj, source), b.obj, "recv", source=source)
            return r if async_op else source.value
        src = self._peer(src, "recv src")
        return self._run("gocollRecvTag", (b.ptr, b.count, b.dtype, src, tag), async_op, (b.obj,),
                         b.obj, "recv")

    def isend(self, tensor, dst, tag=0):
        """:meth:`send` returning a :class:`Work`."""
        return self.send(tensor, dst, tag, async_op=True)

    def irecv(self, tensor, src=None, tag=0):
        """:meth:`recv` returning a :class:`Work` (``src=None``: from any
        source; ``Work.source_rank()`` names the sender)."""
        return self.recv(tensor, src, tag, async_op=True)

    # -- barriers -------------------------------------------------------------

    def barrier(self, *, async_op=False):
        """Return once every rank called barrier."""
        return self._run("gocollBarrier", (), async_op, None, None, "barrier")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """torch.distributed's monitored_barrier: rank 0 waits up to
        ``timeout`` (seconds or a timedelta; None: GOCOLL_TIMEOUT) for a
        message from every other rank, then releases them. A rank that did
        not arrive is named in the :class:`gocoll.Timeout` rank 0 raises —
        the first one, or every one with ``wait_all_ranks`` — and rank 0
        then aborts the communicator, so that the other ranks fail at once
        (:class:`gocoll.RemoteError`) instead of waiting for a release. Uses
        messages of tag 2**31-1 (reserved)."""
        self._handle()
        ms = _timeout_ms(timeout)
        secs = None if ms is None else ms / 1000
        one = lambda: (ctypes.c_uint8 * 1)()  # noqa: E731  (a 1-byte token)
        op = "monitored_barrier"

        def start(name, peer):
            buf = one()
            return self._run(name, (ctypes.addressof(buf), 1, _buffer.UINT8, peer, MONITOR_TAG), True,
                             (buf,), None, op)

        if self._rank != 0:
            release = start("gocollRecvTag", 0)
            arrived = start("gocollSendTag", 0)
            try:
                release.wait(secs)
            except errors.Timeout:
                if release.is_completed():
                    raise
                self.abort()
                raise errors.Timeout("gocoll: monitored_barrier on rank %d: rank 0 did not release "
                                     "this rank within %s; communicator aborted"
                                     % (self._rank, timeout), code=errors.TIMEOUT, op=op) from None
            arrived.wait()
            return None
        waits = [(r, start("gocollRecvTag", r)) for r in range(1, self._size)]
        deadline = None if secs is None else time.monotonic() + secs
        missing = []
        for r, w in waits:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                w.wait(left)
            except errors.Timeout:
                if w.is_completed():
                    raise  # the library's own timeout (GOCOLL_TIMEOUT)
                missing.append(r)
                if not wait_all_ranks:
                    break
        if missing:
            self.abort()
            who = ("rank %d" % missing[0]) if len(missing) == 1 else \
                "ranks %s" % ", ".join(str(r) for r in missing)
            raise errors.Timeout("gocoll: monitored_barrier on rank 0: %s did not arrive within %s; "
                                 "communicator aborted" % (who, timeout), code=errors.TIMEOUT, op=op)
        for w in [start("gocollSendTag", r) for r in range(1, self._size)]:
            w.wait()
        return None

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


class _Waiter:
    """One daemon thread per communicator that waits on works in order and
    runs their callbacks (ctypes releases the GIL while it waits)."""

    def __init__(self, comm):
        import queue
        self._q = queue.SimpleQueue()
        self._t = threading.Thread(target=self._loop, name="gocoll-waiter-%d" % comm.rank,
                                   daemon=True)
        self._t.start()

    def put(self, work, callback):
        self._q.put((work, callback))

    def stop(self):
        self._q.put(None)
        if threading.current_thread() is not self._t:
            self._t.join(timeout=60)

    def _loop(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            work, callback = item
            try:
                work.wait()
            except BaseException:
                pass  # the callback inspects work.exception()
            try:
                callback(work)
            except BaseException as e:  # never kill the waiter
                print("gocoll: completion callback raised %r" % (e,), file=sys.stderr)


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
