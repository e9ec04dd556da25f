"""The all-to-all family of :class:`gocoll.Comm`: all_to_all_single,
all_to_all, alltoallv, alltoallw, and the one place that turns torch's
split sizes (rows of dim 0) into element counts per rank, which the torch
backend uses too."""

import itertools
import operator

from . import _buffer, _lib, errors
from ._args import _SIZE_MAX, _ptr_array
from ._buffer import as_buffer


def split_counts(t, splits, n, op, what):
    """Element counts per rank for splitting ``t`` (a torch tensor or numpy
    array) along dim 0 into ``splits`` rows per rank, or equally when
    ``splits`` is empty (torch's all_to_all_single: dim 0 must then divide
    by the ``n`` ranks)."""
    shape = tuple(t.shape)
    rows = shape[0] if shape else 1
    numel = t.numel() if callable(t.size) else int(t.size)  # torch or numpy
    per_row = numel // rows if rows else 0
    if not splits:
        if rows % n:
            raise errors.InvalidArgument("gocoll: %s: %s has %d rows, not divisible by the %d ranks "
                                         "(pass split sizes)" % (op, what, rows, n))
        return [rows // n * per_row] * n
    try:
        splits = [operator.index(s) for s in splits]
    except TypeError:
        raise errors.InvalidArgument("gocoll: %s: %s split sizes must be integers, got %r"
                                     % (op, what, splits)) from None
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        raise errors.InvalidArgument("gocoll: %s: %s split sizes %s must be %d non-negative row "
                                     "counts adding up to its %d rows" % (op, what, splits, n, rows))
    return [s * per_row for s in splits]


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


def _prefix(counts):
    return list(itertools.accumulate([0] + counts[:-1]))


class AllToAll:
    """The all-to-all methods of :class:`gocoll.Comm` (a mixin: it uses the
    communicator's ``_size``, ``_run``, ``_out`` and ``_list``)."""

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

        if output is None:
            raise errors.InvalidArgument("gocoll: all_to_all_single: output is needed with split sizes")
        sc = split_counts(input, input_split_sizes, n, "all_to_all_single", "input")
        rc = split_counts(output, output_split_sizes, n, "all_to_all_single", "output")
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
