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

:meth:`Plan.cyclic` is document 003's case: 1-D block-cyclic layouts and
an affine loop ``A(a1*i+b1) = B(a2*i+b2)``.
"""

import ctypes
import json

from . import _lib
from ._buffer import as_buffer
from .comm import _check_call

BLOCKS = 0
CYCLIC = 1


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


class Plan:
    """A redistribution plan (gocollPlan_t). Free it with :meth:`close` or
    a ``with`` block."""

    def __init__(self, handle):
        self._lib = _lib.load()
        self._h = handle

    @classmethod
    def cyclic(cls, src, dst, n, src_index=(1, 0), dst_index=(1, 0)):
        """Document 003's loop: ``A(a1*i+b1) = B(a2*i+b2)`` for i < n, B (the
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
