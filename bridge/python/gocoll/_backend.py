"""gocoll as a torch.distributed backend: ``dist.init_process_group("gocoll")``.

Pure Python over the ctypes bridge, using what torch 1.13 and 2.x expose:
``Backend.register_backend(name, creator, ...)`` and the pybind11
trampolines of ``torch._C._distributed_c10d.ProcessGroup`` and ``Work``,
through which the C++ side (DDP's reducer, ``_broadcast_coalesced``,
parameter verification; in 2.x the functional collectives and
``wait_tensor``) calls the methods defined here. torch 2.x still takes a
``ProcessGroup`` subclass from a creator as the group itself ("old
behavior for PythonProcessGroups"), so one class serves both; what 2.x
adds (group names, the coalesced tensor forms, ``_device_types``) is
defined here too and unused on 1.13.

Rendezvous goes through the c10d store torch hands the creator (already
prefixed per group by torch): rank 0 of the group makes a unique id and
publishes its 128 bytes there, the others read it. No second port.

Things torch 1.13 forces on the design, found by experiment:

- A Python ``Work`` returned to C++ only keeps its Python overrides while the
  Python object lives; once it is garbage, C++ ``wait()`` falls back to the
  base class, which never completes. So each work is kept alive by its
  process group until it finished *and* was consumed (waited on or its
  future taken).
- ``Future.set_exception`` stores the exception as a *value*; C++ consumers
  (DDP) then crash or fail with "Unable to cast". The future handed out is a
  ``then`` of the one completed here whose callback raises the error, which
  torch turns into a real error carrying gocoll's message (gocoll._futures).
- C++ calls ``wait`` with a zero timedelta meaning "no timeout".
- DDP waits for the futures in C++, where Ctrl-C cannot raise: a work issued
  on the main thread arms its communicator (gocoll._interrupt) until it
  completes, so that SIGINT aborts it.
"""

import datetime
import inspect
import os
import threading
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from . import _futures, _interrupt, errors
from ._alltoall import split_counts
from .comm import init as _init, get_unique_id as _get_unique_id

BACKEND = "gocoll"

_RED = (("SUM", "sum"), ("PRODUCT", "prod"), ("MIN", "min"), ("MAX", "max"), ("AVG", "avg"),
        ("BAND", "band"), ("BOR", "bor"), ("BXOR", "bxor"))


def register():
    """Register the "gocoll" backend with torch.distributed (idempotent).

    With ``extended_api`` torch hands the creator the group's name and
    global ranks (both 1.13 and 2.x) and the ``pg_options`` of
    ``init_process_group``/``new_group``; ``devices=["cpu"]`` (2.x only)
    tells torch 2.x that gocoll is a CPU backend, so it neither warns nor
    assumes CUDA."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    kwargs = {"extended_api": True}
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        kwargs["devices"] = ["cpu"]
    dist.Backend.register_backend(BACKEND, _create, **kwargs)


class Options:
    """``pg_options`` of a gocoll group (``init_process_group(...,
    pg_options=gocoll.torch.Options(algo="allreduce=ring"))``, also
    ``new_group``): the group's communicator settings, as
    :func:`gocoll.init` takes them; ``timeout`` stays the group's own."""

    def __init__(self, algo=None, debug=None):
        self.algo = algo
        self.debug = debug

    def __repr__(self):
        return "gocoll.torch.Options(algo=%r, debug=%r)" % (self.algo, self.debug)


def _create(opts, pg_options=None):
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError("gocoll: pg_options must be a gocoll.torch.Options, got %s"
                        % type(pg_options).__name__)
    return ProcessGroupGocoll(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                              group_name=opts.group_id, options=pg_options)


def _seconds(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    return s if s > 0 else None  # C++ passes 0 for "no timeout"


# The longest timeout a communicator takes (gocollConfig_t.timeoutMs is a C
# int of milliseconds); a longer group timeout waits this long.
_MAX_TIMEOUT = datetime.timedelta(milliseconds=(1 << 31) - 1)


def _comm_timeout(timeout):
    """The communicator's deadline for the group's timeout: torch's value,
    except that torch's default (which every group gets unless the caller
    chose one) leaves an explicit GOCOLL_TIMEOUT in charge; None (no
    timeout from torch) leaves GOCOLL_TIMEOUT or gocoll's default."""
    if _seconds(timeout) is None:
        return None
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    if timeout == _default_pg_timeout() and os.environ.get("GOCOLL_TIMEOUT"):
        return None
    return min(timeout, _MAX_TIMEOUT)


def _default_pg_timeout():
    from torch.distributed import constants
    return constants.default_pg_timeout


def _flavour(cls):
    name = "Torch" + cls.__name__
    t = type(name, (cls, RuntimeError), {
        "__module__": __name__,
        "__doc__": "%s raised through the torch backend: also a RuntimeError, as torch's "
                   "backends raise." % cls.__name__})
    globals()[name] = t  # picklable by name, as torch's spawned tests need
    return t


# Each error class the backend raises that is not a RuntimeError, with its
# flavour that is (made here, at import, so every process has them).
_FLAVOURS = {c: _flavour(c) for c in (
    errors.Error, errors.UnhandledError, errors.SystemCallError, errors.InternalError,
    errors.InvalidArgument, errors.UnsupportedDtype, errors.RemoteError, errors.InProgress,
    errors.Timeout, TypeError, ValueError)}


def _torch_flavour(cls):
    """cls, or its flavour that is also a RuntimeError."""
    if issubclass(cls, RuntimeError):
        return cls
    return _FLAVOURS.get(cls, cls)


class _Work(_c10d.Work):
    """One torch.distributed operation: the gocoll works it issued (in
    order), a step run once after they all finished (copying out of a
    staging buffer), and the value its future completes with."""

    def __init__(self, pg, op, gworks, result, post=None):
        super().__init__()
        self._pg = pg
        self._op = op
        self._gworks = list(gworks)
        # A recv from any source: its gocoll work names the sender.
        self._source_work = self._gworks[0] if op == "recv" and self._gworks \
            and getattr(self._gworks[0], "_source", None) is not None else None
        self._post = post
        self._result = result
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._exc = None
        self._consumed = False
        self._base, self._public = _futures.pair()
        self._fut = None
        self._armed = bool(self._gworks) and _interrupt.arm(pg._comm)
        pg._keep(self)
        if self._gworks:
            pg._comm.on_complete(self._gworks[-1], lambda _w: self._complete())
        else:
            self._complete()

    def _complete(self):
        """Idempotent: collect errors, run the post step once, complete the
        future. Called by the waiter thread and by wait()."""
        with self._lock:
            if self._done.is_set():
                return
            exc = None
            for w in self._gworks:
                try:
                    w.wait()
                except Exception as e:  # the first error is the operation's
                    exc = exc or e
            if exc is None and self._post is not None:
                try:
                    self._post()
                except Exception as e:
                    exc = e
            if exc is not None:
                exc = self._pg._named(exc, self._op)
            self._exc = exc
            self._gworks = None
            self._post = None
            self._done.set()
            if self._armed:
                _interrupt.disarm(self._pg._comm)
        # outside the lock: then-callbacks (DDP's) run here
        if exc is not None:
            self._base.set_exception(exc)
        else:
            self._base.set_result(self._result)
        self._maybe_release()

    def _maybe_release(self):
        if self._consumed and self._done.is_set():
            self._pg._release(self)

    # -- torch's Work API ---------------------------------------------------

    def wait(self, timeout=None):
        """Block until the operation finished and raise its error (gocoll's
        exception). ``timeout`` (timedelta or seconds; zero or None: no limit
        beyond GOCOLL_TIMEOUT) raises :class:`gocoll.Timeout` when it passes;
        the operation itself goes on."""
        secs = _seconds(timeout)
        # On this thread, not through the waiter (which follows issue order
        # while tagged receives may finish in any order); Ctrl-C can
        # interrupt it.
        deadline = None if secs is None else time.monotonic() + secs
        for w in self._gworks or ():
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                w.wait(left)
            except errors.Timeout:
                if not w.is_completed():
                    raise _torch_flavour(errors.Timeout)(
                        "gocoll: %s on rank %d did not finish within %gs (Work.wait timeout); the "
                        "operation is still pending" % (self._op, self._pg._grank, secs),
                        op=self._op) from None
            except Exception:
                pass  # reported by _complete
        self._complete()
        self._consumed = True
        self._maybe_release()
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        if not self._done.is_set():
            gworks = self._gworks
            if gworks is not None and all(w.is_completed() for w in gworks):
                self._complete()
        return self._done.is_set()

    def is_success(self):
        if not self.is_completed():
            raise RuntimeError("gocoll: %s: is_success() called before the work completed"
                               % self._op)
        return self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        self.wait()
        return list(self._result) if isinstance(self._result, list) else [self._result]

    def source_rank(self):
        """The sender of a recv from any source (torch's ``recv`` without
        ``src``), once it finished; RuntimeError for other operations."""
        gworks = self._gworks
        if self._source_work is None:
            raise RuntimeError("gocoll: %s: source_rank() is only defined for a recv from any "
                               "source" % self._op)
        if gworks is not None:
            self.wait()
        return self._source_work.source_rank()

    _source_rank = source_rank  # the name torch.distributed.recv calls

    def synchronize(self):
        pass  # CPU only: nothing to synchronise with

    def get_future(self):
        """A torch.futures.Future completed with the output tensors when the
        operation finished, or with gocoll's error (a real error for C++
        consumers such as DDP)."""
        with self._lock:
            self._fut = self._public
        self._consumed = True
        self._maybe_release()
        return self._fut

    def __repr__(self):
        return "<gocoll torch Work %s %s>" % (self._op, "done" if self._done.is_set() else "pending")


def _check_dense(t, op, what="tensor"):
    if not isinstance(t, torch.Tensor):
        raise TypeError("gocoll: %s: %s must be a tensor, got %s" % (op, what, type(t).__name__))
    if t.layout is not torch.strided:
        raise errors.InvalidArgument("gocoll: %s: %s is %s; gocoll reduces dense tensors only "
                                     "(call .to_dense())" % (op, what, t.layout))
    if t.device.type != "cpu":
        raise errors.InvalidArgument("gocoll: %s: %s is on %s; the gocoll backend works on CPU "
                                     "tensors only (use .cpu(), or the nccl backend for CUDA)"
                                     % (op, what, t.device))


def _one(tensors, op, what="tensors"):
    if len(tensors) != 1:
        raise errors.InvalidArgument("gocoll: %s: expected one tensor per process, got %d (multiple "
                                     "devices per process are not supported: run one process per device)"
                                     % (op, len(tensors)))
    return tensors[0]


class ProcessGroupGocoll(_c10d.ProcessGroup):
    """A torch.distributed process group backed by one gocoll communicator.

    Made by torch through ``init_process_group("gocoll")`` or
    ``new_group(ranks, backend="gocoll")``; use ``.comm`` for gocoll's own
    API on the same communicator."""

    def __init__(self, store, rank, size, timeout, group_name="", options=None):
        super().__init__(rank, size)
        self._grank = rank
        self._timeout = timeout
        self._group_name = group_name or ""
        self._group_desc = ""
        self._live = {}
        self._live_lock = threading.Lock()
        self._seq = 0  # collectives issued (_get_sequence_number_for_group)
        self._coalesced = None  # works issued inside _start/_end_coalescing
        # A store may see several groups made under one prefix (destroy and
        # init again): every member counts itself in, so the n-th creation
        # reads the n-th key. Creation is collective, so no member of
        # creation n+1 counts before all of creation n did.
        gen = (store.add("gocoll/members", 1) - 1) // size
        key = "gocoll/unique_id/%d" % gen
        secs = _seconds(timeout)
        if rank == 0:
            uid = _get_unique_id()
            store.set(key, uid)
        else:
            try:
                if secs is not None:
                    store.wait([key], datetime.timedelta(seconds=secs))
                uid = store.get(key)
            except RuntimeError as e:
                raise _torch_flavour(errors.Timeout)(
                    "gocoll: init_process_group on rank %d: rank 0 did not publish the unique id "
                    "in the store within %s: %s" % (rank, timeout, e), op="init") from e
        settings = {} if options is None else {"algo": options.algo, "debug": options.debug}
        self.comm = _init(rank=rank, size=size, unique_id=bytes(uid), timeout=_comm_timeout(timeout),
                          **settings)

    def getBackendName(self):
        return BACKEND

    # -- what torch asks of every backend besides the operations -------------

    def _set_sequence_number_for_group(self):
        """torch calls this when it makes a group: the count of its
        collectives starts at 0 on every rank here, so it agrees already."""
        self._seq = 0

    def _get_sequence_number_for_group(self):
        """How many collectives (not sends and receives) this group issued:
        equal on every rank that issued the same ones, as gloo's."""
        return self._seq

    # torch 2.x names its groups (functional collectives, DeviceMesh and
    # destroy_process_group look them up by name). A Python group has no
    # C++ backend to hold the name, so it is kept here: the C++ calls
    # (setGroupName, getGroupName through the trampoline) and the Python
    # ones (_set_group_name, group_name) all reach these.

    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        if not self._group_name:
            raise RuntimeError("gocoll: ProcessGroup name not set (the group was not made by "
                               "torch.distributed)")
        return self._group_name

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    _set_group_name = setGroupName
    _set_group_desc = setGroupDesc
    group_name = property(getGroupName)
    group_desc = property(getGroupDesc)

    @property
    def _device_types(self):
        """torch 2.x asks a group which devices its backends serve (FSDP's
        sharded state dict, the default device of object collectives,
        async checkpoints); a Python group has no C++ backend to say so."""
        return [torch.device("cpu")]

    def _start_coalescing(self, device=None):
        """The bracket of batch_isend_irecv (1.13, no argument) and of
        torch 2.x's coalescing manager (the device). gocoll's operations are
        non-blocking and progress independently, so nothing is held back:
        the bracket only notes what is issued inside it."""
        self._coalesced = []

    def _end_coalescing(self, reqs_or_device=None):
        """See _start_coalescing. 1.13 passes the requests, which complete
        on their own; 2.x passes the device and waits on the work returned,
        which completes once every operation issued in the bracket did."""
        issued, self._coalesced = self._coalesced, None
        if isinstance(reqs_or_device, (list, tuple)) or issued is None:
            return None
        works = [w for w, _ in issued]

        def finish():  # each work's own step (copying out of staging)
            for w in works:
                w.wait()
        return _Work(self, "coalesced", [g for _, gs in issued for g in gs], [], post=finish)

    def __repr__(self):
        return "<ProcessGroupGocoll rank %d of %d>" % (self.rank(), self.size())

    # -- bookkeeping ----------------------------------------------------------

    @property
    def _comm(self):
        return self.comm

    def _keep(self, work):
        with self._live_lock:
            self._live[id(work)] = work

    def _release(self, work):
        with self._live_lock:
            self._live.pop(id(work), None)

    def _named(self, exc, op):
        """``exc`` with its message naming the torch operation and rank, as
        an error that is also a RuntimeError (what torch's own backends
        raise, and what torch code catches), keeping gocoll's class."""
        text = str(exc)
        tag = "rank %d" % self._grank
        cls = _torch_flavour(type(exc))
        if op in text and tag in text:
            if cls is type(exc):
                return exc
            msg = text
        else:
            msg = "gocoll: %s on rank %d: %s" % (op, self._grank, text)
        if isinstance(exc, errors.Error):
            new = cls(msg, code=exc.code, reason=exc.reason, op=exc.op or op)
        else:
            try:
                new = cls(msg)
            except Exception:
                return exc
        new.__cause__ = exc
        return new

    def _issue(self, op, fn, result):
        """Run ``fn()`` (which issues gocoll works and returns (works, post)),
        naming op and rank in any error raised at the call."""
        try:
            gworks, post = fn()
        except (errors.Error, TypeError, ValueError) as e:
            raise self._named(e, op) from None
        if op not in ("send", "recv"):
            self._seq += 1
        work = _Work(self, op, gworks, result, post)
        if self._coalesced is not None:
            self._coalesced.append((work, list(gworks)))
        return work

    def _redop(self, opts, op):
        red = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        for name, ours in _RED:
            if red == getattr(dist.ReduceOp, name):
                return ours
        raise errors.InvalidArgument("gocoll: %s on rank %d: reduction %s is not supported "
                                     "(SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR)"
                                     % (op, self._grank, getattr(red, "op", red)))

    @staticmethod
    def _staged(t):
        """(buffer gocoll can use, step copying it back to ``t`` or None)."""
        if t.is_contiguous():
            return t, None
        c = t.contiguous()
        return c, (lambda: t.copy_(c))

    @staticmethod
    def _chain(*steps):
        steps = [s for s in steps if s is not None]
        if not steps:
            return None

        def run():
            for s in steps:
                s()
        return run

    # -- collectives ----------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = "all_reduce"

        def go():
            t = _one(tensors, op)
            _check_dense(t, op)
            b, back = self._staged(t)
            return [self.comm.all_reduce(b, self._redop(opts, op), async_op=True)], back
        return self._issue(op, go, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = "all_reduce_coalesced"

        def go():
            for t in tensors:
                _check_dense(t, op)
            if len({t.dtype for t in tensors}) > 1:
                raise errors.InvalidArgument("gocoll: %s: tensors have different dtypes; call it once "
                                             "per dtype" % op)
            flat = torch.cat([t.reshape(-1) for t in tensors])
            w = self.comm.all_reduce(flat, self._redop(opts, op), async_op=True)

            def back():
                off = 0
                for t in tensors:
                    n = t.numel()
                    t.copy_(flat[off:off + n].view_as(t))
                    off += n
            return [w], back
        return self._issue(op, go, tensors)

    def broadcast(self, tensors, opts=None):
        op = "broadcast"

        def go():
            t = _one(tensors, op)
            _check_dense(t, op)
            if getattr(opts, "rootTensor", 0) != 0:
                raise errors.InvalidArgument("gocoll: broadcast: rootTensor must be 0 (one tensor "
                                             "per process: run one process per device)")
            b, back = self._staged(t)
            return [self.comm.broadcast(b, src=opts.rootRank, async_op=True)], back
        return self._issue(op, go, tensors)

    def reduce(self, tensors, opts=None):
        op = "reduce"

        def go():
            t = _one(tensors, op)
            _check_dense(t, op)
            b, back = self._staged(t)
            w = self.comm.reduce(b, dst=opts.rootRank, op=self._redop(opts, op), async_op=True)
            return [w], back
        return self._issue(op, go, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        op = "all_gather"

        def go():
            outs = _one(output_tensors, op, "output lists")
            t = _one(input_tensors, op)
            _check_dense(t, op)
            for o in outs:
                _check_dense(o, op, "output_tensor_list")
            return [self.comm.all_gather(outs, t.contiguous(), async_op=True)], None
        return self._issue(op, go, output_tensors)

    def _allgather_base(self, output, input, opts=None):
        op = "all_gather_into_tensor"
        return self._issue(op, lambda: self._gather_into(output, input, op), [output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """torch 2.x: several all_gather_into_tensor at once (functional
        collectives, the coalescing manager)."""
        op = "all_gather_into_tensor_coalesced"
        return self._issue(op, lambda: self._each(op, self._gather_into, outputs, inputs),
                           list(outputs))

    def _gather_into(self, output, input, op):
        _check_dense(output, op, "output")
        _check_dense(input, op, "input")
        if output.numel() != input.numel() * self.size():
            raise errors.InvalidArgument(
                "gocoll: %s: output has %d elements, want world size (%d) x input (%d)"
                % (op, output.numel(), self.size(), input.numel()))
        o, back = self._staged(output)
        return [self.comm.all_gather_into_tensor(o, input.contiguous(), async_op=True)], back

    def _each(self, op, one, outputs, inputs, *args):
        """The works and copy-back steps of ``one(output, input, op, *args)``
        for every pair: the coalesced forms as one torch Work."""
        if len(outputs) != len(inputs):
            raise errors.InvalidArgument("gocoll: %s: %d outputs for %d inputs"
                                         % (op, len(outputs), len(inputs)))
        works, steps = [], []
        for o, i in zip(outputs, inputs):
            ws, back = one(o, i, op, *args)
            works += ws
            steps.append(back)
        return works, self._chain(*steps)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = "reduce_scatter"

        def go():
            out = _one(output_tensors, op)
            ins = _one(input_tensors, op, "input lists")
            _check_dense(out, op, "output")
            for x in ins:
                _check_dense(x, op, "input_list")
            o, back = self._staged(out)
            return [self.comm.reduce_scatter(o, list(ins), self._redop(opts, op),
                                              async_op=True)], back
        return self._issue(op, go, output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = "reduce_scatter_tensor"
        return self._issue(op, lambda: self._scatter_from(output, input, op, opts), [output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """torch 2.x: several reduce_scatter_tensor at once (functional
        collectives, the coalescing manager)."""
        op = "reduce_scatter_tensor_coalesced"
        return self._issue(op, lambda: self._each(op, self._scatter_from, outputs, inputs, opts),
                           list(outputs))

    def _scatter_from(self, output, input, op, opts):
        _check_dense(output, op, "output")
        _check_dense(input, op, "input")
        if input.numel() != output.numel() * self.size():
            raise errors.InvalidArgument(
                "gocoll: %s: input has %d elements, want world size (%d) x output (%d)"
                % (op, input.numel(), self.size(), output.numel()))
        o, back = self._staged(output)
        return [self.comm.reduce_scatter_tensor(o, input.contiguous(), self._redop(opts, op),
                                                async_op=True)], back

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        op = "all_to_all_single"

        def go():
            _check_dense(output, op, "output")
            _check_dense(input, op, "input")
            # torch's rule (dim 0 divides by the ranks) even for equal splits
            n = self.size()
            sc = split_counts(input, input_split_sizes, n, op, "input")
            rc = split_counts(output, output_split_sizes, n, op, "output")
            o, back = self._staged(output)
            w = self.comm.alltoallv(input.contiguous(), sc, rc, out=o.view(-1), async_op=True)
            return [w], back
        return self._issue(op, go, [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        op = "all_to_all"

        def go():
            for t in list(output_tensors) + list(input_tensors):
                _check_dense(t, op)
            return [self.comm.all_to_all(output_tensors, input_tensors, async_op=True)], None
        return self._issue(op, go, output_tensors)

    # gather and scatter are all-to-alls where only the root sends or
    # receives: a collective of its own, so they never match a user's
    # pending send/recv between the same two ranks.

    def gather(self, output_tensors, input_tensors, opts=None):
        op = "gather"

        def go():
            n, root, me = self.size(), opts.rootRank, self.rank()
            t = _one(input_tensors, op)
            _check_dense(t, op)
            k = t.numel()
            sc = [k if j == root else 0 for j in range(n)]
            if me == root:
                outs = _one(output_tensors, op, "gather lists")
                self._check_list(outs, t, op, "gather_list")
                flat = torch.empty(n * k, dtype=t.dtype)
                rc = [k] * n
            else:
                if output_tensors and any(len(x) for x in output_tensors):
                    raise errors.InvalidArgument("gocoll: gather: gather_list must be given on "
                                                 "the destination rank only")
                flat, rc, outs = torch.empty(0, dtype=t.dtype), [0] * n, None
            w = self.comm.alltoallv(t.contiguous(), sc, rc, out=flat, async_op=True)

            def back():
                if outs is not None:
                    for i, o in enumerate(outs):
                        o.copy_(flat[i * k:(i + 1) * k].view_as(o))
            return [w], back
        return self._issue(op, go, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        op = "scatter"

        def go():
            n, root, me = self.size(), opts.rootRank, self.rank()
            t = _one(output_tensors, op)
            _check_dense(t, op)
            k = t.numel()
            rc = [k if j == root else 0 for j in range(n)]
            if me == root:
                ins = _one(input_tensors, op, "scatter lists")
                self._check_list(ins, t, op, "scatter_list")
                flat = torch.cat([x.reshape(-1) for x in ins])
                sc = [k] * n
            else:
                if input_tensors and any(len(x) for x in input_tensors):
                    raise errors.InvalidArgument("gocoll: scatter: scatter_list must be given on "
                                                 "the source rank only")
                flat, sc = torch.empty(0, dtype=t.dtype), [0] * n
            o, back = self._staged(t)
            return [self.comm.alltoallv(flat, sc, rc, out=o.view(-1), async_op=True)], back
        return self._issue(op, go, output_tensors)

    def _check_list(self, lst, like, op, what):
        if len(lst) != self.size():
            raise errors.InvalidArgument("gocoll: %s: %s has %d tensors, want one per rank (%d)"
                                         % (op, what, len(lst), self.size()))
        for x in lst:
            _check_dense(x, op, what)
            if x.numel() != like.numel() or x.dtype != like.dtype:
                raise errors.InvalidArgument(
                    "gocoll: %s: %s holds a %s tensor of %d elements, want %s of %d (the "
                    "gocoll backend needs equal sizes)" % (op, what, x.dtype, x.numel(),
                                                           like.dtype, like.numel()))

    # -- point to point -------------------------------------------------------
    # Tags match as in gloo: a recv with tag t takes the oldest message from
    # src with tag t (gocoll matches them in the engine).

    def send(self, tensors, dst, tag=0):
        op = "send"

        def go():
            t = _one(tensors, op)
            _check_dense(t, op)
            return [self.comm.send(t.contiguous(), dst, tag, async_op=True)], None
        return self._issue(op, go, tensors)

    def recv(self, tensors, src, tag=0):
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._recv(tensors, None, tag)

    def _recv(self, tensors, src, tag):
        """recv from src, or from any source (src None: the work's
        source_rank names the sender)."""
        op = "recv"

        def go():
            t = _one(tensors, op)
            _check_dense(t, op)
            b, back = self._staged(t)
            return [self.comm.recv(b, src, tag, async_op=True)], back
        return self._issue(op, go, tensors)

    def barrier(self, opts=None):
        return self._issue("barrier", lambda: ([self.comm.barrier(async_op=True)], None), [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """torch's monitored_barrier on this group (``gocoll.torch.monitored_barrier``
        calls it: torch's ``dist.monitored_barrier`` accepts gloo only).
        Rank 0 names the ranks that did not arrive within ``timeout`` (default:
        the group's) in a :class:`gocoll.Timeout` and aborts the group's
        communicator; see :meth:`gocoll.Comm.monitored_barrier`."""
        if timeout is None:
            timeout = self._timeout
        try:
            self.comm.monitored_barrier(timeout, wait_all_ranks)
        except errors.Error as e:
            raise self._named(e, "monitored_barrier") from None

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        op = "all_gather_coalesced"

        def go():
            for t in input_list:
                _check_dense(t, op, "input_tensor_list")
            for outs in output_lists:
                for t in outs:
                    _check_dense(t, op, "output_tensor_lists")
            return [self.comm.all_gather_coalesced(output_lists, input_list, async_op=True)], None
        return self._issue(op, go, output_lists)
