"""Layouts of distributed arrays and moving an array between them.

A *resource map* (:class:`Map`) says which device (rank) owns which part of
an N-dimensional index space: the space is cut into tiles, numbered in
row-major order and given to devices in contiguous runs ("blocks", equal or
weighted by device speed) or in turn ("cyclic"). A device's buffer holds
its tiles back to back, each row-major.

A :class:`Plan` moves an array from one layout to another without
contention (no rank receives two messages in one step), computed alike on
every rank, and runs on a communicator with zero copies of the caller's
numpy arrays or torch CPU tensors::

    src = gocoll.vppu.Map.block((1024, 1024), dim=0, devices=comm.size)
    dst = gocoll.vppu.Map.block_cyclic((1024, 1024), dim=1, devices=comm.size, block=64)
    plan = gocoll.vppu.Plan.maps(src, dst)
    n_src, n_dst = plan.counts(comm.rank)
    out = numpy.empty(n_dst, numpy.float32)
    plan.redistribute(comm, mine, out)

:meth:`Plan.cyclic` is the case of docs/design/redistribution.md: 1-D block-cyclic layouts and
an affine loop ``A(a1*i+b1) = B(a2*i+b2)``.
"""

import ctypes
import json

from . import _lib
from ._buffer import as_buffer
from .comm import _check_call

BLOCKS = 0
CYCLIC = 1


class _Handle:
    """A library handle freed by ``close()``, by a ``with`` block or when
    garbage-collected."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Map:
    """A regular resource map (gocollMap_t)."""

    def __init__(self, extent, tile, devices, assign="blocks", weights=None):
        self.extent = tuple(int(e) for e in extent)
        self.tile = tuple(int(t) for t in tile)
        if len(self.tile) != len(self.extent):
            raise ValueError("gocoll: %d tile extents for %d dimensions" % (len(self.tile), len(self.extent)))
        self.devices = int(devices)
        if assign not in ("blocks", "cyclic"):
            raise ValueError("gocoll: assign must be 'blocks' or 'cyclic', not %r" % (assign,))
        self.assign = assign
        self.weights = None if weights is None else tuple(float(w) for w in weights)

    @classmethod
    def block(cls, extent, dim, devices, weights=None):
        """Contiguous bands of dimension ``dim`` (proportional to ``weights``)."""
        return cls(extent, _along(extent, dim, 1), devices if weights is None else len(weights), "blocks", weights)

    @classmethod
    def block_cyclic(cls, extent, dim, devices, block):
        """Bands of ``block`` indices of dimension ``dim`` dealt in turn."""
        return cls(extent, _along(extent, dim, block), devices, "cyclic")

    def _c(self):
        n = len(self.extent)
        ext = (ctypes.c_size_t * n)(*self.extent)
        tile = (ctypes.c_size_t * n)(*self.tile)
        w = None
        if self.weights is not None:
            w = (ctypes.c_double * len(self.weights))(*self.weights)
        m = _lib.Map(n, ext, tile, self.devices, BLOCKS if self.assign == "blocks" else CYCLIC, w)
        m._keep = (ext, tile, w)  # the arrays must live as long as the struct
        return m

    def __repr__(self):
        return "Map(extent=%r, tile=%r, devices=%d, assign=%r%s)" % (
            self.extent, self.tile, self.devices, self.assign,
            "" if self.weights is None else ", weights=%r" % (self.weights,))


def _along(extent, dim, x):
    if not 0 <= dim < len(extent):
        raise ValueError("gocoll: dimension %d of a %d-dimensional space" % (dim, len(extent)))
    t = [0] * len(extent)
    t[dim] = x
    return t


class Plan(_Handle):
    """A redistribution plan (gocollPlan_t). Free it with :meth:`close` or
    a ``with`` block."""

    def __init__(self, handle):
        self._lib = _lib.load()
        self._h = handle

    @classmethod
    def cyclic(cls, src, dst, n, src_index=(1, 0), dst_index=(1, 0)):
        """The loop of docs/design/redistribution.md: ``A(a1*i+b1) = B(a2*i+b2)`` for i < n, B (the
        source) block-cyclic over ``src = (procs, block)``, A over ``dst``;
        ``src_index = (a2, b2)``, ``dst_index = (a1, b1)``."""
        lib = _lib.load()
        h = ctypes.c_void_p()
        _check_call(lib.gocollPlanCyclic(ctypes.byref(h), int(src[0]), int(src[1]), int(dst[0]), int(dst[1]),
                                         int(src_index[0]), int(src_index[1]), int(dst_index[0]),
                                         int(dst_index[1]), int(n)), "gocollPlanCyclic")
        return cls(h.value)

    @classmethod
    def maps(cls, src, dst):
        """Between two :class:`Map` of the same space."""
        lib = _lib.load()
        h = ctypes.c_void_p()
        a, b = src._c(), dst._c()
        _check_call(lib.gocollPlanMaps(ctypes.byref(h), ctypes.byref(a), ctypes.byref(b)), "gocollPlanMaps")
        return cls(h.value)

    def _handle(self):
        if self._h is None:
            from .errors import InvalidUsage
            raise InvalidUsage("gocoll: the plan was closed", code=5)
        _lib.check_process()
        return self._h

    def place(self, src_ranks=None, dst_ranks=None):
        """Source processor i on ``src_ranks[i]``, destination j on ``dst_ranks[j]``."""
        def arr(r):
            return None if r is None else (ctypes.c_int * len(r))(*[int(x) for x in r])
        _check_call(self._lib.gocollPlanPlace(self._handle(), arr(src_ranks), arr(dst_ranks)), "gocollPlanPlace")

    def counts(self, rank):
        """(elements ``rank`` holds in the source layout, in the destination layout)."""
        s, d = ctypes.c_size_t(), ctypes.c_size_t()
        _check_call(self._lib.gocollPlanCounts(self._handle(), int(rank), ctypes.byref(s), ctypes.byref(d)),
                    "gocollPlanCounts")
        return s.value, d.value

    def info(self):
        """The plan as a dict: ``com``, ``steps``, ``method``, ``lower_bound``, ``q``, ``p``, ``from``."""
        need = ctypes.c_size_t()
        _check_call(self._lib.gocollPlanGetJSON(self._handle(), None, 0, ctypes.byref(need)), "gocollPlanGetJSON")
        buf = ctypes.create_string_buffer(need.value)
        _check_call(self._lib.gocollPlanGetJSON(self._handle(), buf, need.value, ctypes.byref(need)),
                    "gocollPlanGetJSON")
        return json.loads(buf.value.decode("utf-8"))

    def redistribute(self, comm, src, dst):
        """Moves this rank's ``src`` (its elements in the source layout, or None)
        into ``dst`` (its elements in the destination layout, or None), in place,
        without copying the arrays."""
        n_src, n_dst = self.counts(comm.rank)
        sb = as_buffer(src, "src", writable=False) if src is not None else None
        db = as_buffer(dst, "dst") if dst is not None else None
        dt = (sb or db).dtype if (sb or db) else 0
        for b, need, what in ((sb, n_src, "src"), (db, n_dst, "dst")):
            if b is not None and b.dtype != dt:
                raise TypeError("gocoll: src and dst have different dtypes")
            if need and (b is None or b.count < need):
                from .errors import InvalidArgument
                raise InvalidArgument("gocoll: %s holds %s elements; this rank's layout needs %d"
                                      % (what, "no" if b is None else b.count, need), code=4)
        comm._check(self._lib.gocollRedistribute(self._handle(), sb.ptr if sb else None, db.ptr if db else None,
                                                 dt, comm._handle()), "gocollRedistribute")

    def close(self):
        if self._h is not None:
            _check_call(self._lib.gocollPlanDestroy(self._h), "gocollPlanDestroy")
            self._h = None


class VirtualComm(_Handle):
    """Virtual devices (gocollVComm_t): ``ndev`` devices with a logical
    topology (``"ring"``, ``"mesh:AxB"``, ``"torus:AxB"``, ``"tree"``,
    ``"full"``) placed on the ranks of ``comm``: device v on rank
    ``place[v]`` (None: in blocks over all ranks). Creating one and
    :meth:`migrate` are collectives of ``comm``; the collectives are those
    of the ranks hosting devices.

    A rank drives its devices (:attr:`devices`, increasing) together: every
    collective takes a list with one numpy array or torch CPU tensor per
    local device, in that order, used without copying. Results do not
    depend on the placement, to the bit: every reduction folds the ``ndev``
    contributions in device order (``avg`` divides that sum by ``ndev``)::

        vc = gocoll.vppu.VirtualComm(comm, "ring", 8)
        grads = [numpy.ones(1000, numpy.float32) for _ in vc.devices]
        vc.allreduce(grads)                 # in place, on every device
        vc.migrate([0, 0, 0, 0, 1, 1, 1, 1])
    """

    def __init__(self, comm, topology="ring", ndev=None, place=None):
        self._lib = _lib.load()
        self._comm = comm
        ndev = comm.size if ndev is None else int(ndev)
        self.ndev = ndev
        h = ctypes.c_void_p()
        _check_call(self._lib.gocollVCommCreate(ctypes.byref(h), comm._handle(), topology.encode("utf-8"), ndev,
                                                self._place(place)), "gocollVCommCreate", comm._handle())
        self._h = h.value
        self._mine = {}  # (device, name) -> the caller's registered object
        self._shared = {}  # name -> the caller's object registered shared

    def _place(self, place):
        if place is None:
            return None
        place = [int(r) for r in place]
        if len(place) != self.ndev:
            from .errors import InvalidArgument
            raise InvalidArgument("gocoll: placement of %d devices for %d virtual devices" % (len(place), self.ndev),
                                  code=4)
        return (ctypes.c_int * len(place))(*place)

    def _handle(self):
        if self._h is None:
            from .errors import InvalidUsage
            raise InvalidUsage("gocoll: the virtual communicator was closed", code=5)
        _lib.check_process()
        return self._h

    def _check(self, rc, op):
        _check_call(rc, op, self._comm._handle())

    @property
    def devices(self):
        """The devices this rank hosts, in increasing order."""
        devs = (ctypes.c_int * self.ndev)()
        n = ctypes.c_int()
        self._check(self._lib.gocollVCommLocal(self._handle(), devs, self.ndev, ctypes.byref(n)), "gocollVCommLocal")
        return list(devs[:n.value])

    def device_rank(self, dev):
        """The rank that hosts device ``dev``."""
        r = ctypes.c_int()
        self._check(self._lib.gocollVCommDeviceRank(self._handle(), int(dev), ctypes.byref(r)),
                    "gocollVCommDeviceRank")
        return r.value

    def tables(self):
        """The placement and its routing tables as a dict: ``topology``,
        ``place``, ``local`` and ``tables`` (``virtual``, ``physical``,
        ``in_use``, ``free``)."""
        need = ctypes.c_size_t()
        self._check(self._lib.gocollVCommGetTables(self._handle(), None, 0, ctypes.byref(need)),
                    "gocollVCommGetTables")
        buf = ctypes.create_string_buffer(need.value)
        self._check(self._lib.gocollVCommGetTables(self._handle(), buf, need.value, ctypes.byref(need)),
                    "gocollVCommGetTables")
        return json.loads(buf.value.decode("utf-8"))

    def register(self, dev, name, array):
        """Attach ``array`` (kept alive here, not copied) to local device
        ``dev`` as ``name``: a migration moves its bytes with the device."""
        b = as_buffer(array, "register %r" % (name,))
        self._check(self._lib.gocollVCommRegister(self._handle(), int(dev), name.encode("utf-8"), b.ptr, b.nbytes),
                    "gocollVCommRegister")
        self._mine[(int(dev), name)] = array

    def register_shared(self, name, array):
        """Attach ``array`` (kept alive here, not copied) to every local
        device as ``name``, kept once on this rank: state every device holds
        alike (parameters, momentum). A migration or :meth:`recover` sends
        a copy to a rank that has none."""
        b = as_buffer(array, "register_shared %r" % (name,))
        self._check(self._lib.gocollVCommRegisterShared(self._handle(), name.encode("utf-8"), b.ptr, b.nbytes),
                    "gocollVCommRegisterShared")
        self._shared[name] = array

    def recover(self, new_comm, step, *, min_ranks=0, place=None):
        """After ranks died: move the devices onto ``new_comm`` (from
        :meth:`gocoll.Comm.shrink` of this one's communicator), which
        becomes this one's communicator. Every rank of ``new_comm`` calls
        it. ``step``: how many steps this rank's shared state has completed;
        ranks may differ by one, and every rank ends with the state of the
        highest (copied into the arrays registered here). Returns that step:
        go on from it. Surviving devices stay (``place`` None; else device v
        goes to rank ``place[v]``). Raises :class:`~gocoll.errors.InvalidUsage`
        when ``new_comm`` has fewer than ``min_ranks`` ranks or a lost
        device had its own (non-shared) buffers; one of ``PEER_FAILURES``
        when another rank dies meanwhile (shrink again, recover again)."""
        agreed = ctypes.c_uint64()
        self._check(self._lib.gocollVCommRecover(self._handle(), new_comm._handle(), int(step), int(min_ranks),
                                                 self._place(place), ctypes.byref(agreed)), "gocollVCommRecover")
        self._comm = new_comm
        here = set(self.devices)
        self._mine = {k: v for k, v in self._mine.items() if k[0] in here}
        return agreed.value

    @classmethod
    def join(cls, comm, topology="ring", ndev=None, *, min_ranks=0, place=None):
        """The joining process's side of the members' :meth:`recover`:
        ``comm`` is what :func:`gocoll.join` returned (the members called
        :meth:`gocoll.Comm.grow`, then ``recover`` on the grown
        communicator, with the same ``min_ranks`` and ``place``). Returns
        ``(vcomm, step)``: this process's devices, whose shared state
        arrived in library memory (:meth:`buffer`), and the step the job
        goes on from. A joiner whose ``topology``, ``ndev``, ``min_ranks``
        or ``place`` differ from the members' is refused
        (:class:`~gocoll.errors.InvalidArgument`); the members go on."""
        self = cls.__new__(cls)
        self._lib = _lib.load()
        self._comm = comm
        self.ndev = comm.size if ndev is None else int(ndev)
        self._mine, self._shared, self._h = {}, {}, None
        h, agreed = ctypes.c_void_p(), ctypes.c_uint64()
        _check_call(self._lib.gocollVCommJoinPlace(ctypes.byref(h), comm._handle(), topology.encode("utf-8"), self.ndev,
                                                   int(min_ranks), self._place(place), ctypes.byref(agreed)),
                    "gocollVCommJoinPlace", comm._handle())
        self._h = h.value
        return self, agreed.value

    def buffer(self, dev, name, dtype=None, shape=None):
        """The buffer registered as ``name`` with local device ``dev``: the
        caller's own object, or, for a device that arrived in a migration, a
        numpy view (no copy) of the library's memory, as ``dtype`` and
        ``shape`` when given (bytes otherwise). The view is valid until the
        device leaves this rank or :meth:`close`."""
        dev = int(dev)
        if (dev, name) in self._mine:
            return self._mine[(dev, name)]
        if name in self._shared and dev in self.devices:
            return self._shared[name]
        import numpy as np
        ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
        self._check(self._lib.gocollVCommGetBuffer(self._handle(), dev, name.encode("utf-8"), ctypes.byref(ptr),
                                                   ctypes.byref(size)), "gocollVCommGetBuffer")
        if size.value == 0:
            a = np.empty(0, np.uint8)
        else:
            a = np.ctypeslib.as_array((ctypes.c_uint8 * size.value).from_address(ptr.value))
        if dtype is not None:
            a = a.view(dtype)
        if shape is not None:
            a = a.reshape(shape)
        return a

    def migrate(self, place=None):
        """Move device v to rank ``place[v]`` (None: blocks over all ranks)
        with its registered buffers; every rank of the communicator calls
        it. Afterwards :meth:`buffer` gives the arrived devices' data."""
        self._check(self._lib.gocollVCommMigrate(self._handle(), self._place(place)), "gocollVCommMigrate")
        here = set(self.devices)
        self._mine = {k: v for k, v in self._mine.items() if k[0] in here}

    def _bufs(self, objs, what, per_device, writable=True, optional=False):
        devs = self.devices
        if objs is None:
            objs = [None] * len(devs)
        objs = list(objs)
        if len(objs) != len(devs):
            from .errors import InvalidArgument
            raise InvalidArgument("gocoll: %d %s for %d local devices %s" % (len(objs), what, len(devs), devs),
                                  code=4)
        bufs = [None if (o is None and optional) else as_buffer(o, what, writable=writable) for o in objs]
        present = [b for b in bufs if b is not None]
        if present:
            dt, n = present[0].dtype, present[0].count
            for b in present:
                if b.dtype != dt or b.count != n:
                    raise TypeError("gocoll: %s differ in dtype or size between devices" % what)
        arr = (ctypes.c_void_p * max(len(bufs), 1))(*[b.ptr if b is not None else None for b in bufs])
        return arr, present

    def _run(self, name, args, async_op, keep, result, op):
        if not async_op:
            self._check(getattr(self._lib, name)(*args, self._handle()), name)
            return result
        from .comm import Work
        req = ctypes.c_void_p()
        self._check(getattr(self._lib, "gocollVI" + name[len("gocollV"):])(*args, self._handle(), ctypes.byref(req)),
                    name)
        w = Work(self._comm, req.value, keep, result, op)
        with self._comm._plock:
            self._comm._pending.add(w)
        return w

    def allreduce(self, tensors, op="sum", *, out=None, async_op=False):
        """Reduce over all devices; results replace ``tensors`` (or go to ``out``)."""
        from .comm import _op
        s, sb = self._bufs(tensors, "allreduce tensors", 1)
        r, rb = (s, sb) if out is None else self._bufs(out, "allreduce out", 1)
        return self._run("gocollVAllReduce", (s, r, sb[0].count if sb else 0, sb[0].dtype if sb else 0, _op(op)),
                         async_op, (tensors, out, s, r), tensors if out is None else out, "allreduce")

    def reduce(self, tensors, root=0, op="sum", *, out=None, async_op=False):
        """Reduce into device ``root``'s tensor (or ``out``) only."""
        from .comm import _op
        s, sb = self._bufs(tensors, "reduce tensors", 1)
        r, _ = (s, sb) if out is None else self._bufs(out, "reduce out", 1, optional=True)
        return self._run("gocollVReduce", (s, r, sb[0].count if sb else 0, sb[0].dtype if sb else 0, _op(op),
                                           int(root)), async_op, (tensors, out, s, r),
                         tensors if out is None else out, "reduce")

    def broadcast(self, tensors, root=0, *, async_op=False):
        """Copy device ``root``'s tensor into every device's, in place."""
        s, sb = self._bufs(tensors, "broadcast tensors", 1)
        return self._run("gocollVBroadcast", (s, s, sb[0].count if sb else 0, sb[0].dtype if sb else 0, int(root)),
                         async_op, (tensors, s), tensors, "broadcast")

    def allgather(self, tensors, out, *, async_op=False):
        """Every device's ``out`` (``ndev`` times as long) gets all devices'
        ``tensors``, device 0 first."""
        s, sb = self._bufs(tensors, "allgather tensors", 1, writable=False)
        r, _ = self._bufs(out, "allgather out", self.ndev)
        return self._run("gocollVAllGather", (s, r, sb[0].count if sb else 0, sb[0].dtype if sb else 0),
                         async_op, (tensors, out, s, r), out, "allgather")

    def reduce_scatter(self, tensors, out, op="sum", *, async_op=False):
        """Reduce ``tensors`` (``ndev`` blocks) over all devices; device v's
        ``out`` gets block v."""
        from .comm import _op
        s, _ = self._bufs(tensors, "reduce_scatter tensors", self.ndev, writable=False)
        r, rb = self._bufs(out, "reduce_scatter out", 1)
        return self._run("gocollVReduceScatter", (s, r, rb[0].count if rb else 0, rb[0].dtype if rb else 0,
                                                  _op(op)), async_op, (tensors, out, s, r), out, "reduce_scatter")

    def alltoall(self, tensors, out, *, async_op=False):
        """Block w of device v's tensor goes to block v of device w's ``out``."""
        s, sb = self._bufs(tensors, "alltoall tensors", self.ndev, writable=False)
        r, _ = self._bufs(out, "alltoall out", self.ndev)
        return self._run("gocollVAllToAll", (s, r, sb[0].count // self.ndev if sb else 0, sb[0].dtype if sb else 0),
                         async_op, (tensors, out, s, r), out, "alltoall")

    def redistribute(self, plan, srcs, dsts):
        """Run ``plan`` (a :class:`Plan` whose processors are the virtual
        devices) on this rank's devices: ``srcs[k]``/``dsts[k]`` hold local
        device k's elements in the source/destination layout (None where it
        holds none; sizes from ``plan.counts(device)``), used without copying."""
        devs = self.devices
        if len(srcs) != len(devs) or len(dsts) != len(devs):
            from .errors import InvalidArgument
            raise InvalidArgument("gocoll: %d sources and %d destinations for %d local devices"
                                  % (len(srcs), len(dsts), len(devs)), code=4)
        sb = [None if x is None else as_buffer(x, "redistribute src", writable=False) for x in srcs]
        db = [None if x is None else as_buffer(x, "redistribute dst") for x in dsts]
        types = {b.dtype for b in sb + db if b is not None}
        if len(types) > 1:
            raise TypeError("gocoll: redistribute buffers of different dtypes")
        n = max(len(devs), 1)
        s = (ctypes.c_void_p * n)(*[b.ptr if b else None for b in sb])
        d = (ctypes.c_void_p * n)(*[b.ptr if b else None for b in db])
        self._check(self._lib.gocollVRedistribute(plan._handle(), s, d, types.pop() if types else 0, self._handle()),
                    "gocollVRedistribute")

    def barrier(self):
        self._check(self._lib.gocollVBarrier(self._handle()), "gocollVBarrier")

    def close(self):
        """Free the handle (and the buffers the library allocated)."""
        if self._h is not None:
            h, self._h = self._h, None
            self._mine = {}
            _check_call(self._lib.gocollVCommDestroy(h), "gocollVCommDestroy")
