"""The reductions, broadcast and gathers of :class:`gocoll.Comm`."""

import ctypes
import zlib

from . import _buffer, errors
from ._args import _op
from ._buffer import as_buffer


def _fingerprint(kinds):
    """8 bytes naming a list of (datatype, count): all_gather_coalesced's
    check that every rank packed the same tensors."""
    h = zlib.crc32(repr(kinds).encode())
    return h.to_bytes(4, "little") + (len(kinds) & 0xFFFFFFFF).to_bytes(4, "little")


class Collectives:
    """all_reduce, reduce, broadcast, the all-gathers and reduce-scatters of
    :class:`gocoll.Comm` (a mixin: it uses the communicator's ``_size``,
    ``_rank``, ``_peer``, ``_run``, ``_out`` and ``_list``)."""

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
